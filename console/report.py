"""Plain-text views of box data for the command line (the TUI has its own widgets).

Every line is made inert before the lines are joined (`_text`): a control character from the
box (ESC, CSI, OSC, C1, a newline inside a command line) is shown as a visible stand-in, so it
can neither drive the terminal nor fake a line of the report."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from samai.console.core import units
from samai.console.core.death import cause_of_death, death_line
from samai.console.core.redact import redact
from samai.remote.safe_text import visible

if TYPE_CHECKING:  # annotations only: a command that prints one report imports no more than it needs
    from samai.console.core.config import Config
    from samai.console.core.disk.budget import DiskBudget, StagePeak
    from samai.console.core.evals.diff import Changed, EvalDiff
    from samai.console.core.timeline import Event
    from samai.remote.model import Snapshot

TOP_PROCESSES = 15
MAX_AGE = 100 * 365 * 86400.0


def describe_snapshot(snap: Snapshot, cfg: Config) -> str:
    lines = [f"{snap.host}  workspace {cfg.workspace}  round trip {snap.rtt * 1000:.0f} ms"]
    for d in snap.disks:
        lines.append(f"disk  {d.label:<9} {d.mount:<12} used {units.size(d.used)} of {units.size(d.total)}, "
                     f"free {units.size(d.free)}")
    lines.append("stages")
    for stage in cfg.stages:
        rec = snap.state(stage.name)
        state = rec.status if rec else "idle"
        extra = ""
        if rec:
            extra = f"pid {rec.pid}  fired {when(rec.fired_at, snap.time)}"
            if rec.rc is not None:
                extra += f"  rc={rec.rc}"
        lines.append(f"  [{stage.key}] {stage.name:<10} {state:<8} {extra}")
        death = cause_of_death(rec, snap) if rec else None
        if death is not None:
            lines.append(f"      {death_line(death)}")
    present = [a for a in snap.artifacts if a.exists]
    if present:
        lines.append("artifacts")
        lines.extend(f"  {a.name:<12} {units.size(a.bytes):>9}  {a.path}" for a in present)
    if snap.listeners:
        lines.append("listening")
        for s in snap.listeners:
            proc = snap.process(s.pid) if s.pid else None
            owner = f"pid {s.pid} {redact(proc.command)[:60]}" if proc else "owner not visible"
            lines.append(f"  {s.host}:{s.port:<6} {owner}")
    lines.append(f"processes ({len(snap.processes)}; top {TOP_PROCESSES} by cpu; the exact start times that kill "
                 "--start-time takes: snapshot --json)")
    lines.append(f"  {'PID':>7} {'USER':<10} {'CPU%':>5} {'RSS':>9} {'STARTED':<24}  COMMAND")
    for p in sorted(snap.processes, key=lambda p: p.cpu_percent, reverse=True)[:TOP_PROCESSES]:
        lines.append(f"  {p.pid:>7} {p.user[:10]:<10} {p.cpu_percent:>5.1f} {units.size(p.rss):>9} "
                     f"{when(p.start_time, snap.time):<24}  {redact(p.command)[:80]}")
    for e in snap.errors:
        lines.append(f"error {e.get('what')}: {e.get('error')}")
    return _text(lines)


def when(t: float, now: float) -> str:
    """A moment of the box as a person reads it: how long ago, and the local time (with the date
    when it is not today's): `2h00m ago, 05:31:10` or `3d02h ago, 2026-11-27 07:12`."""
    if not (math.isfinite(t) and math.isfinite(now)) or abs(now - t) > MAX_AGE:
        return "?"  # the box's clock or its reply is off: no made-up age
    try:
        moment, today = time.localtime(t), time.localtime(now)
    except (OverflowError, OSError, ValueError):
        return "?"
    clock = time.strftime("%H:%M:%S" if today[:3] == moment[:3] else "%Y-%m-%d %H:%M", moment)
    ago = f"{units.age(now - t)} ago" if t <= now + 1 else f"in {units.age(t - now)}"
    return f"{ago}, {clock}"


def describe_plan(now: DiskBudget, peaks: list[StagePeak]) -> str:
    limit = peaks[0].limit if peaks else now.capacity
    lines = [f"capacity {units.size(now.capacity)} (usable {units.size(limit)} after the reserve), "
             f"used {units.size(now.used)}, free {units.size(now.free)}, reclaimable {units.size(now.reclaimable)}",
             f"  {'stage':<10} {'peak':>9} {'if nothing deleted':>19}  alive at the peak"]
    for p in peaks:
        flag = "" if p.fits else "  OVER CAPACITY"
        if p.cleaned:
            flag += f": {units.size(p.cleaned_peak)} after deleting {', '.join(p.cleaned)} first"
        kept = units.size(p.kept_peak) + ("" if p.kept_fits else " (!)")
        lines.append(f"  {p.stage:<10} {units.size(p.peak):>9} {kept:>19}  {' + '.join(p.alive) or '-'}{flag}")
    unsafe = [p.stage for p in peaks if not p.kept_fits]
    if unsafe:
        lines.append(f"keeping every intermediate would overflow the disk at: {', '.join(unsafe)}")
    return _text(lines)


def describe_check(kind: str, path: str, result: dict) -> str:
    """What a check found, for a person: the headline figures, then every finding."""
    shown = {"gguf": ("size", "version", "tensor_count", "kv_count", "header_end", "data_offset", "data_end",
                      "expected_size", "last_tensor", "bytes_read", "architecture", "embedding_length"),
             "trainlog": ("lines", "unparsed"),
             "eval": ("format", "layout", "n", "correct", "accuracy", "pred_none", "truncated", "empty_content",
                      "malformed"),
             "episodes": ("n", "successes", "success_rate", "parse_failures", "missed", "no_action", "errors",
                          "over_cap", "malformed")}[
        "episodes" if result.get("format") == "episodes" else kind]
    lines = [f"{kind} {path}: " + "  ".join(f"{k} {_figure(k, result[k])}" for k in shown if result.get(k) is not None)]
    if kind == "gguf" and result.get("size_note"):
        lines.append(f"  {result['size_note']}")
    if kind == "gguf" and result.get("projector"):
        from samai.remote.box.gguf_check import projector_text

        lines.append(f"  {projector_text(result['projector'])}")
    if kind == "trainlog":
        points = result.get("points", [])
        steps = result.get("steps", len(points))  # points past a few thousand are thinned: steps counts all
        kept = f" ({len(points)} kept)" if len(points) < steps else ""
        lines.append(f"  {steps} logged steps{kept}" + (f", last loss {points[-1]['loss']}" if points else ""))
    findings = result.get("problems", []) + result.get("anomalies", [])
    for f in findings:
        where = f" (step {f['step']})" if f.get("step") is not None else ""
        lines.append(f"  {f.get('severity', 'error'):<7} {f['code']}{where}: {f['message']}")
    if not findings:
        lines.append("  no problems found")
    return _text(lines)


def _figure(key: str, value: object) -> str:
    """A headline figure as a person reads it (the JSON keeps the exact value)."""
    if key in ("accuracy", "success_rate") and isinstance(value, float):
        return f"{100 * value:.1f} %"
    return str(value)


def _text(lines: list[str]) -> str:
    """The lines for a terminal: each made inert first, so a newline inside one cannot start another."""
    return "\n".join(visible(line) for line in lines)


# ------------------------------------------------------------------ eval diff

DIFF_SHOWN = 12  # items listed per kind; --json lists them all


def describe_diff(d: EvalDiff) -> str:
    lines = [f"eval diff {visible(d.a.name)} → {visible(d.b.name)}: "
             f"{_pct(d.a.accuracy)} → {_pct(d.b.accuracy)} ({len(d.a.items)} and {len(d.b.items)} items)"]
    lines.append(_verdict(d))
    for title, items in (("right → wrong", d.right_to_wrong), ("wrong → right", d.wrong_to_right),
                         ("became empty", d.became_empty), ("became truncated", d.became_truncated),
                         ("answer only in the reasoning", d.only_in_reasoning)):
        if items:
            lines.append(f"{title}: {len(items)}")
            lines += [_changed(c) for c in items[:DIFF_SHOWN]]
            if len(items) > DIFF_SHOWN:
                lines.append(f"  … {len(items) - DIFF_SHOWN} more (--json lists them all)")
    for title, ids in ((f"only in {visible(d.a.name)}", d.only_in_a), (f"only in {visible(d.b.name)}", d.only_in_b)):
        if ids:
            shown = ", ".join(visible(i) for i in ids[:DIFF_SHOWN])
            lines.append(f"{title}: {len(ids)} ({shown}{', …' if len(ids) > DIFF_SHOWN else ''})")
    for name, run in (("A", d.a), ("B", d.b)):
        if run.unreadable or run.duplicates:
            lines.append(f"{name} ({visible(run.name)}): {run.unreadable} lines not items, "
                         f"{run.duplicates} ids seen again (their first line counts)")
    return "\n".join(lines)


def _verdict(d: EvalDiff) -> str:
    if d.delta is None or d.interval is None:
        return "no item is in both runs: nothing to pair"
    low, high = d.interval
    judged = "within noise (the interval holds 0)" if d.noise else "more than noise"
    return (f"on the {d.paired} items both hold: Δ {d.delta * 100:+.1f} points, 95 % interval "
            f"[{low * 100:+.1f}, {high * 100:+.1f}], McNemar p = {d.p_value:.3g}: {judged}")


def _changed(c: Changed) -> str:
    return f"  {visible(c.id)}: gold {visible(c.gold)} · A {visible(c.a) or '(empty)'} · B {visible(c.b) or '(empty)'}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


# ------------------------------------------------------------------ timeline


def describe_timeline(events: list[Event]) -> str:
    """One line per event: its time (UTC; "~" where it is its run's start, the line's own time
    not being written), where it came from, what it was."""
    if not events:
        return "nothing on the timeline yet"
    lines = []
    for e in events:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.time))
        where = f"{e.source}:{e.stage}" if e.stage else e.source
        at = f" ({visible(e.path.rsplit('/', 1)[-1])}:{e.line})" if e.line is not None else ""
        lines.append(f"{'~' if e.approx else ' '}{stamp}  {visible(where):<16} {visible(e.kind):<10} "
                     f"{visible(e.text)}{at}")
    return "\n".join(lines)
