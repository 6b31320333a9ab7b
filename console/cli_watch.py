"""`samai-console watch`: the headless watcher on the command line. Its notification URLs come
from the config, the environment variable it names, or --notify (a URL holding a credential is
refused there: a command line is visible to every user of the machine)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Sequence

from samai.console.core.config import Config
from samai.console.core.redact import redact
from samai.remote.safe_text import visible

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
TOKEN_LIKE = re.compile(r"[A-Za-z0-9_\-]{16,}")  # a path part or query value this long is taken for a token


class WatchUsage(ValueError):
    pass


def notify_urls(cfg: Config, given: Sequence[str]) -> list[str]:
    """The config's URLs, then the environment's (the variable is removed: the stages this
    watcher's box tools start do not inherit it), then --notify's."""
    for i, url in enumerate(given, 1):
        reason = credential_in(url)
        if reason:
            raise WatchUsage(f"--notify #{i}: {reason}: a command line is visible to every user of this machine; "
                             f"put it in [notify] urls of {cfg.source} or in ${cfg.notify.urls_env}")
    from_env = os.environ.pop(cfg.notify.urls_env, "")
    return [*cfg.notify.urls, *(u for u in re.split(r"[\s,]+", from_env) if u), *given]


def credential_in(url: str) -> str:
    """Why a URL holds a credential ("" when it does not): a part apprise keeps private for its
    service (a bot token, an app token, a password: url_privacy), or a password or token by its shape."""
    import urllib.parse

    from samai.console.core.watch.url_privacy import private_parts

    split = urllib.parse.urlsplit(url)
    if split.password or (split.username and "@" in split.netloc and ":" in split.netloc.split("@")[0]):
        return "it holds a password"
    private = private_parts(url)
    if private:
        return f"it holds what apprise keeps private for its service ({', '.join(private)})"
    if redact(url) != url:
        return "it holds a token"
    parts = [*split.path.split("/"), *(v for _, v in urllib.parse.parse_qsl(split.query)), split.username or ""]
    if any(TOKEN_LIKE.fullmatch(p) for p in parts if p):
        return "it holds what looks like a token"
    return ""


def say(line: str) -> None:
    """One line of the watcher's log: stamped, inert (box text in it shown as visible stand-ins)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} {visible(line)}", flush=True)


async def run(cfg: Config, *, notify: Sequence[str], once: bool, all_boxes: bool, readonly: bool,
              interval: float | None) -> int:
    from dataclasses import replace

    from samai.console.core.actions import me
    from samai.console.core.connect import open_box
    from samai.console.core.fleet import fleet_configs
    from samai.console.core.watch.sender import NotifyConfigError, SecretMask, Sender, receivers, route_apprise_log
    from samai.console.core.watch.trust import Trust, TrustError
    from samai.console.core.watch.watcher import BoxWatcher, Identity, watch

    try:
        urls = notify_urls(cfg, notify)
        mask = SecretMask.of_config(cfg, urls=urls)  # the URLs, and every variable the config names
        log = lambda line: say(mask(line))  # noqa: E731
        sender = Sender(receivers(urls), log, mask=mask)
        trust = Trust.load()  # this machine's watch key: what it sealed on a box is believed
    except (WatchUsage, NotifyConfigError, TrustError) as e:
        print(f"samai-console: {visible(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    route_apprise_log(mask, log)
    if not urls:
        log(f"no notification URL ([notify] urls, ${cfg.notify.urls_env} or --notify): alerts are only written here")
    configs = fleet_configs(cfg) if all_boxes else [("" if not cfg.boxes else _box_name(cfg), cfg)]
    ident = Identity(secrets.token_hex(6), me(), socket.gethostname())
    watchers = []
    for name, box_cfg in configs:
        if interval is not None:
            box_cfg = replace(box_cfg, watch=replace(box_cfg.watch, interval=interval))
        box_cfg = replace(box_cfg, target=replace(box_cfg.target, poll_interval=box_cfg.watch.interval))
        watchers.append(BoxWatcher(name, box_cfg, lambda c: open_box(c, readonly=readonly), sender, ident,
                                   readonly=readonly, say=log, trust=trust))
    receivers_said = ", ".join(r.name for r in sender.receivers) or "none"
    log(f"watching {len(watchers)} box(es) every {watchers[0].config.watch.interval:g} s as {ident.who} "
        f"(pid {ident.pid}); receivers: {receivers_said}" + ("; read-only" if readonly else ""))
    if once:
        return EXIT_OK if await _once_with_outage(watchers) else EXIT_PROBLEM
    task = asyncio.ensure_future(watch(watchers))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        log("stopped")
    return EXIT_OK


def _box_name(cfg: Config) -> str:
    """The name of the box a config was opened on (--box), by its target and workspace."""
    return next((b.name for b in cfg.boxes if b.target == cfg.target and b.workspace == cfg.workspace), "")


async def _once_with_outage(watchers) -> bool:
    """--once: each box's outage carried from the last run on this machine (a cron run lasts
    one poll; the outage it belongs to lasts minutes)."""
    from samai.console.core.paths import state_dir
    from samai.console.core.watch.watcher import watch

    folder = state_dir() / "watch"
    files = {}
    for w in watchers:
        key = hashlib.sha256(f"{w.config.target.url}\0{w.config.workspace}".encode()).hexdigest()[:16]
        files[w] = folder / f"outage-{key}.json"
        try:
            kept = json.loads(files[w].read_text())
            since, said = kept.get("since"), kept.get("said")
            if isinstance(since, (int, float)) and not isinstance(since, bool) and isinstance(said, bool):
                w.outage.since, w.outage.said = float(since), said
        except (OSError, ValueError, AttributeError):
            pass
    answered = await watch(watchers, once=True)
    folder.mkdir(parents=True, exist_ok=True)
    for w, path in files.items():
        path.write_text(json.dumps({"since": w.outage.since, "said": w.outage.said}))
    return answered
