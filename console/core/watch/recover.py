"""Recovery by policy, opt-in ([watch] recover): a fix the TUI offers for an alert, run by the
watcher when the alert stands and nobody is at the keys. Decided by the death's cause (retry.py:
never a crash loop), through the same action layer (its identity checks, its preflight, its audit
line, via "by the watcher"), never over a preflight that blocks, never twice for one death, at most
[watch] max_recoveries per stage per hour with a backoff between tries; every decision, to retry
or not, is an audit line and a message that says why."""

from __future__ import annotations

from dataclasses import dataclass, field

from samai.console.core.alertbook import RUN_ENDED, Alert
from samai.console.core.config import Config
from samai.console.core.kinds import ActionKind
from samai.console.core.roles import Role
from samai.console.core.watch.policy import HOUR_S, REST, Message, alert_identity, plain
from samai.console.core.watch.retry import Death, decide
from samai.remote.model import watch_time

BY_THE_WATCHER = "by the watcher"
# Each recovery: the fix its alert offers, the role of the stage it is for, and the alert's code.
RECOVERIES: dict[str, tuple[ActionKind, Role, str]] = {
    "resume_train": (ActionKind.RESUME, Role.TRAIN, RUN_ENDED),
    "restart_serve": (ActionKind.RESTART, Role.SERVE, RUN_ENDED),
    "restart_hung_serve": (ActionKind.RESTART, Role.SERVE, "serve_hung"),  # alive but stuck (serving_watch)
}


@dataclass(frozen=True)
class Due:
    key: str  # the death's alert identity: recovered once
    stage: str
    kind: ActionKind
    alert: Alert


@dataclass
class RecoveryBook:
    """What was recovered: each death once, and when, per stage (the hourly cap)."""

    done: dict[str, float] = field(default_factory=dict)  # alert identity -> when it was handled
    times: dict[str, list[float]] = field(default_factory=dict)  # stage -> recoveries run, in the last hour
    deaths: dict[str, list[tuple[str, int | None]]] = field(default_factory=dict)  # stage -> (cause, step) handled

    def recent(self, stage: str, now: float) -> list[float]:
        kept = [t for t in self.times.get(stage, []) if now - t < HOUR_S]
        self.times[stage] = kept
        return kept

    def to_json(self) -> dict:
        return {"done": dict(sorted(self.done.items(), key=lambda kv: kv[1])[-200:]), "times": self.times,
                "deaths": {stage: [list(d) for d in kept[-20:]] for stage, kept in self.deaths.items()}}

    @classmethod
    def of(cls, raw: object) -> RecoveryBook:
        """From a ledger (anyone may have written it: what does not parse is dropped)."""
        book = cls()
        if not isinstance(raw, dict):
            return book
        done, times = raw.get("done"), raw.get("times")
        if isinstance(done, dict):
            book.done = {k: t for k, t in ((k, watch_time(v)) for k, v in list(done.items())[:400])
                         if isinstance(k, str) and len(k) <= 400 and t is not None}
        if isinstance(times, dict):
            book.times = {k: [t for t in map(watch_time, v[-100:]) if t is not None]
                          for k, v in list(times.items())[:100] if isinstance(k, str) and isinstance(v, list)}
        deaths = raw.get("deaths")
        if isinstance(deaths, dict):
            book.deaths = {k: [d for d in map(_death, v[-20:]) if d is not None]
                           for k, v in list(deaths.items())[:100] if isinstance(k, str) and isinstance(v, list)}
        return book


def _death(raw: object) -> tuple[str, int | None] | None:
    """A handled death's (cause, step) from the ledger: a short word and a step in range, or nothing."""
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and len(raw[0]) <= 40):
        return None
    step = raw[1]
    if step is not None and not (type(step) is int and 0 <= step < 10**12):
        return None
    return raw[0], step


def recoveries_due(config: Config, alerts: list[Alert], book: RecoveryBook) -> list[Due]:
    """The standing deaths whose fix the config lets the watcher run, not handled yet."""
    out = []
    for a in alerts:
        stage = config.stage(a.stage or (a.action.stage if a.action else ""))
        if not (a.active and a.action is not None and stage):
            continue
        # A run's death is that run's (its identity holds the run); a hang is each time it is raised.
        key = alert_identity(a) if a.code == RUN_ENDED else f"{alert_identity(a)}|{a.time:.3f}"
        for name in config.watch.recover:
            kind, role, code = RECOVERIES[name]
            if a.code == code and stage.role == role and a.action.kind is kind and key not in book.done:
                out.append(Due(key, stage.name, kind, a))
    return out


def recovery_message(box: str, due: Due, ok: bool, words: str, why: str = "") -> Message:
    """What the operator is told: what the watcher did (or why it did not), why, and about what."""
    title = f"samai {box}: " if box else "samai: "
    title += words if ok else f"not recovered: {due.stage}"
    body = (f"{words}\n" if not ok else f"why: {why}\n" if why else "") + f"after: {plain(due.alert.text)}" + (
        "" if ok else "\nNothing was forced: fix it at the console and press x.")
    # A recovery that failed is an error the watcher judged itself: a lane of its own, per stage.
    return Message(f"recovery|{due.key}", "recovery", "info" if ok else "error", title, body,
                   REST if ok else f"error|recovery|{due.stage}", due.stage)


async def recover(actions, config: Config, box: str, due: Due, book: RecoveryBook, now: float,
                  death: Death) -> Message | None:
    """Decide one recovery by its death's cause (retry.decide) and run it through the action layer
    (its confirm answers for the watcher: never over a blocking preflight), or say why not; the
    death is handled either way, but for a backoff (None: asked again at a later cycle)."""
    from samai.console.core.training.resume import NothingToResume

    stage = config.stage(due.stage)
    verdict = decide(death, book.deaths.get(due.stage, []), book.recent(due.stage, now), now,
                     config.watch.max_recoveries, trains=bool(stage and stage.role.trains),
                     backoff_s=config.watch.backoff_s)
    if verdict.wait_s > 0:
        return None
    book.done[due.key] = now
    book.deaths.setdefault(due.stage, []).append((death.cause, death.step))
    verb = "resumed" if due.kind is ActionKind.RESUME else "restarted"
    if not verdict.retry:
        actions.audit.record(action=due.kind.value, stage=due.stage, by=BY_THE_WATCHER, result="declined",
                             cause=death.cause, step=death.step, message=f"not {verb}: {verdict.why}")
        return recovery_message(box, due, False, f"not {verb}: {verdict.why}")
    try:
        if due.kind is ActionKind.RESUME:
            outcome = await actions.resume(due.stage)
        else:
            outcome = await actions.restart(due.stage)
    except NothingToResume as e:
        return recovery_message(box, due, False, f"nothing to resume from: {e}")
    # Every try counts, not only those that went well: a run the watcher restarted that dies within
    # its fire's verify window is a new death, recovered again only while the hour allows.
    book.times.setdefault(due.stage, []).append(now)
    if outcome.status in ("ok", "done") or outcome.ok:
        checkpoint = getattr(outcome.plan, "checkpoint", "")
        did = f"resumed {due.stage} from {checkpoint.rsplit('/', 1)[-1]}" if checkpoint else f"restarted {due.stage}"
        return recovery_message(box, due, True, did, verdict.why)
    return recovery_message(box, due, False, plain(outcome.message, 300))
