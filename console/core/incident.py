"""An incident bundle: one JSON file a colleague can open anywhere (`samai-console replay FILE`,
read-only): the box's snapshot as the probe answered it, the last lines of each stage's log, the
timeline, what doctor finds now, and the config with its secrets masked.

Everything in it passes through the config's SecretMask before it is written (its secrets by
shape, and by where the config keeps them: every notification URL and its parts, the values of
the variables its `*_env` keys name), and every part is bounded: at
most MAX_LINES lines of each log (each cut to LINE_CHARS), MAX_EVENTS events (the newest; an
event says how many older ones it leaves out), MAX_PROCESSES processes, so a bundle stays under
a few MB whatever the box holds. Its format is the recording
console/replay.py renders ({"workspace", "probe", "logs"}), with the rest beside it."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from samai.console import __version__
from samai.console.core import config as config_mod
from samai.console.core.redact import MASK, redact_assignment
from samai.console.core.secret_mask import SecretMask
from samai.console.core.timeline import NOT_SHOWN, Event, read_timeline
from samai.console.replay import log_key
from samai.remote import model
from samai.remote.boxapi import Box, BoxError

FORMAT = "samai-incident/1"
MAX_LINES = 200  # of each stage's log, its last ones
LINE_CHARS = 1000
MAX_EVENTS = 5000
MAX_PROCESSES = 2000
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")  # a notification URL's service, kept in a bundle
MAX_BUNDLE = 64 << 20  # a file to replay is refused past this (a bundle made here is far below it)


class NotABundle(ValueError):
    """A file that `replay` cannot open, said in a few words."""


@dataclass(frozen=True)
class Bundle:
    data: dict[str, Any]

    @property
    def config(self) -> config_mod.Config:
        """The bundled config (masked), read as on the box it came from; the tiny pipeline's if it
        no longer reads (a masked value where a number was)."""
        workspace, tables = str(self.data.get("workspace") or ""), self.data.get("config")
        try:
            cfg = config_mod.from_raw(tables if isinstance(tables, dict) else {}, "(incident bundle)")
        except config_mod.ConfigError:
            cfg = config_mod.load_builtin("tiny")
        return replace(cfg, workspace=workspace) if workspace else cfg

    @property
    def made_at(self) -> float:
        made = self.data.get("made_at")
        return float(made) if isinstance(made, (int, float)) and not isinstance(made, bool) else 0.0


async def make_bundle(box: Box, cfg: config_mod.Config, audit: Path, *, since: float | None,
                      findings: list[dict], mask: SecretMask | None = None) -> dict[str, Any]:
    """The bundle's content, masked (by the config's mask, unless one is given) and bounded."""
    mask = mask or SecretMask.of_config(cfg)
    raw = await box.ask_probe(box.snapshot_request(writers=True))
    processes = list(raw.get("processes") or [])
    raw["processes"] = processes[:MAX_PROCESSES]
    if len(processes) > MAX_PROCESSES:  # said where the probe says what it could not read (snapshot's errors)
        more = f"{len(processes) - MAX_PROCESSES:,} more not in this bundle (its first {MAX_PROCESSES:,} are)"
        raw["errors"] = [*(raw.get("errors") or []), {"what": "processes", "error": more}]
    logs = {}
    for stage in cfg.stages:
        chunk = await box.tail(cfg.path_of(stage.log), last_lines=MAX_LINES)
        lines = chunk.data.decode("utf-8", "replace").splitlines()[-MAX_LINES:]
        logs[log_key(stage.log)] = "".join(line[:LINE_CHARS] + "\n" for line in lines)
    events: list[Event] = kept_events(await read_timeline(box, cfg, audit, since=since), MAX_EVENTS)
    return mask.all({
        "format": FORMAT, "made_at": time.time(), "console": __version__, "target": cfg.target.url,
        "workspace": cfg.workspace, "config": config_tables(cfg, mask), "probe": raw, "logs": logs,
        "timeline": [e.to_json() for e in events], "findings": findings,
    })


def kept_events(events: list[Event], limit: int) -> list[Event]:
    """The newest `limit` events, and where older ones were cut, an event that says how many
    (a bundle never holds a part of the timeline as if it were the whole)."""
    if len(events) <= limit:
        return events
    kept = events[len(events) - limit:]
    cut = Event(kept[0].time, "bundle", NOT_SHOWN, f"{len(events) - limit:,} older events not in this bundle "
                f"(its newest {limit:,} are)", severity="warning")
    return [cut, *kept]


def config_tables(cfg: config_mod.Config, mask: SecretMask | None = None) -> dict[str, Any]:
    """The config's own tables (a built-in pipeline's as shipped), masked: every text by the mask,
    in a stage's env the whole value of a secret's name (HF_TOKEN), and each notification URL
    but its scheme (the service: `tgram://***`), whatever its shape."""
    source, mask = cfg.source, mask or SecretMask()
    try:
        if source.startswith("(built-in "):
            text = config_mod.builtin_text(source[len("(built-in "):-1])
        else:
            text = config_mod.read_capped(source, source).decode("utf-8", "replace")
        tables = config_mod.toml(text, source)
    except (OSError, config_mod.ConfigError):
        return {}
    notify = tables.get("notify")
    if isinstance(notify, dict) and isinstance(notify.get("urls"), list):
        tables["notify"] = {**notify, "urls": [service_only(u) for u in notify["urls"]]}
    return _masked(tables, mask)


def service_only(url: Any) -> str:
    """A notification URL as a bundle keeps it: its scheme (the service), nothing after."""
    scheme = url.split("://", 1)[0] if isinstance(url, str) else ""
    return f"{scheme}://{MASK}" if SCHEME.fullmatch(scheme) else f"unknown://{MASK}"


def _masked(value: Any, mask: SecretMask, env: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: mask(redact_assignment(k, v).split("=", 1)[1]) if env and isinstance(v, str)
                else _masked(v, mask, env=k == "env") for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, mask) for v in value]
    return mask(value) if isinstance(value, str) else value


def write_bundle(content: dict[str, Any], out: Path) -> int:
    """Written beside, then renamed (an interrupted write leaves no half bundle); its size."""
    data = json.dumps(content, ensure_ascii=True, separators=(",", ":"), default=str).encode("ascii")
    part = out.with_name(out.name + ".part")
    part.write_bytes(data)
    part.replace(out)
    return len(data)


def read_bundle(path: Path) -> Bundle:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE + 1)
    except OSError as e:
        raise NotABundle(f"{path}: {e.strerror or e}") from None
    if len(data) > MAX_BUNDLE:
        raise NotABundle(f"{path}: over {MAX_BUNDLE >> 20} MB, not a bundle this console wrote")
    try:
        content = json.loads(data)
    except (ValueError, RecursionError):
        raise NotABundle(f"{path}: not JSON") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise NotABundle(f"{path}: not an incident bundle ({FORMAT})")
    if not isinstance(content.get("probe"), dict) or not isinstance(content.get("logs"), dict):
        raise NotABundle(f"{path}: a bundle without its snapshot or logs")
    content["logs"] = {k: v for k, v in content["logs"].items() if isinstance(k, str) and isinstance(v, str)}
    try:
        model.snapshot(content["probe"], 0.0)  # as replay will read it: refused now, not in the TUI
    except BoxError as e:
        raise NotABundle(f"{path}: its snapshot cannot be read ({e})") from None
    return Bundle(content)
