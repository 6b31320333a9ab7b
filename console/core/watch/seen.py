"""What the console's status line says of the box's watchers: "watched by op@host · last sent
3 min ago", a watcher gone silent, or "not watched". Pure: from the box's watch folder as read."""

from __future__ import annotations

from samai.console.core import units
from samai.remote.model import WatcherBeat, WatchShared

SILENT_INTERVALS = 3  # a watcher that has not beaten for this many of its intervals is silent
MIN_SILENT_S = 60.0
FUTURE_S = 5.0  # a beat "written" later than the box's now was not written by the box's tool: none


def _silent_for(beat: WatcherBeat, now: float) -> float:
    """Seconds since its last beat, past what its interval allows (0: alive)."""
    age = now - beat.written
    return age if age > max(SILENT_INTERVALS * beat.interval, MIN_SILENT_S) else 0.0


def watched_words(shared: WatchShared | None, now: float) -> tuple[str, bool]:
    """The words, and whether they are good news. now: the box's clock (a beat's `written` is).
    "watched by" only from a live heartbeat of the lease's holder: the box names a holder only
    while it beats, and its beat must be alive here too; any other watcher alive is standing by."""
    if shared is None:
        return "", True
    beats = [b for b in shared.watchers if now - b.written >= -FUTURE_S]
    alive = [b for b in beats if not _silent_for(b, now)]
    leader = next((b for b in alive if b.id == shared.leader), None)
    if leader is None:
        held = [b for b in beats if b.id == shared.leader]
        silent = held[0] if held else max(beats, key=lambda b: b.written, default=None)
        if silent is not None and _silent_for(silent, now):
            return f"watcher {_name(silent)} silent for {units.duration(now - silent.written)}", False
        if alive:
            return f"no watcher leads ({len(alive)} standing by)", False
        return "not watched", False
    words = f"watched by {_name(leader)}"
    if len(alive) > 1:
        words += f" (+{len(alive) - 1} standing by)"
    if leader.last_sent is not None and leader.last_poll is not None:
        # The watcher's clock: how long before its last poll it sent, plus how old that beat is.
        ago = max(leader.last_poll - leader.last_sent, 0.0) + max(now - leader.written, 0.0)
        words += f" · last sent {units.duration(ago)} ago"
    else:
        words += " · nothing sent yet"
    problems = []
    if leader.unsent:
        problems.append(f"{leader.unsent} not sent")
    if leader.last_error:
        problems.append(leader.last_error[:80])
    return words + ("".join(f" · {p}" for p in problems)), not problems


def _name(beat: WatcherBeat) -> str:
    return beat.who or beat.id
