"""One box watched with nobody at the keys: the TUI's BoxSession and ConsoleState, the notify
policy over the state's alerts, the outage rule, and this watcher's share of the box's watch
folder (its heartbeat, the lease to send, the leader's ledger, the acknowledgements).

Only the watcher holding the lease sends, so two watchers of one box send once; the ledger it
leaves lets the next one (a restart, a cron run) go on without sending again."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from samai.console.core.config import Config
from samai.console.core.session import BoxSession, OpenBox, PollFailed
from samai.console.core.watch.policy import NotifyPolicy, OutageWatch
from samai.console.core.watch.recover import BY_THE_WATCHER, RecoveryBook, recover, recoveries_due
from samai.console.core.watch.sender import Sender
from samai.remote.model import WatchShared

LEASE_INTERVALS = 3  # the lease to send outlives this many missed beats
MIN_LEASE_S = 30.0


@dataclass
class Identity:
    """Who this watcher is, as its heartbeat says."""

    id: str
    who: str  # user@host
    host: str
    pid: int = field(default_factory=os.getpid)
    since: float = field(default_factory=time.time)


def console_command(config: Config) -> str:
    """The command that opens this config's console (a message's fix says to run it)."""
    import shlex

    builtin = config.source.startswith("(built-in")
    return "samai-console" + ("" if builtin else f" --config {shlex.quote(config.source)}")


def ledger_statuses(ledger: dict) -> dict[str, str]:
    raw = ledger.get("statuses")
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(raw, dict) else {}


def ledger_looked_at(ledger: dict) -> float | None:
    """The box's time at the last poll of the watcher that wrote the ledger."""
    at = ledger.get("box_at")
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at) else None


class BoxWatcher:
    def __init__(self, name: str, config: Config, open_box: OpenBox, sender: Sender, me: Identity, *,
                 readonly: bool = False, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.time) -> None:
        self.name, self.config, self.sender, self.me = name, config, sender, me
        self.readonly, self.clock = readonly, clock
        self.say = (lambda line: say(f"{name}: {line}")) if name else say
        self.session = BoxSession(config, open_box, clock=clock)
        self.policy = NotifyPolicy(config.notify, name, console_command(config))
        self.outage = OutageWatch(name, config.watch.unreachable_after)
        self.leading = readonly  # read-only: it writes no heartbeat and takes no lease, so it sends alone
        self.acked: set[str] = set()
        self.book = RecoveryBook()  # the deaths recovered (or not) by policy
        self.last_poll: float | None = None
        self.last_error = ""
        self._seeded = False
        self.polls = 0  # cycles done (tests wait on it)

    @property
    def state(self):
        return self.session.state

    async def cycle(self) -> PollFailed | None:
        """One poll, what it calls for sent (by the leader), and the heartbeat."""
        if not self._seeded:
            await self._seed()
        result = await self.session.poll_once()
        self.polls += 1
        now = self.clock()
        if isinstance(result, PollFailed):
            self.last_error = result.error
            if result.bug:
                self.say(f"internal error: {result.error}")
            down = self.outage.failed(result.error, now)
            if down and self.leading:  # the last known leader says it (the box holds the lease)
                await self.sender.send(self.policy.capped([down], now), now)
            return result
        self.last_poll, self.last_error = now, ""
        back = self.outage.answered(now)
        shared = await self._beat(now)
        if shared is not None:
            self.acked = set(shared.acks)
        if self.leading:  # a watcher standing by sends nothing and keeps no ledger of its own
            messages = self.policy.capped([back], now) if back else []
            snap = self.state.snapshot
            runs = {r.stage: r.fired_at for r in snap.states} if snap else {}
            await self.sender.send(messages + self.policy.due(self.state.alerts, self.acked, now, runs), now)
            await self._recover(now)
        return None

    async def _recover(self, now: float) -> None:
        """The fixes [watch] recover lets it run, for the deaths that stand (read-only: none)."""
        if self.readonly or not self.config.watch.recover:
            return
        for due in recoveries_due(self.config, self.state.alerts, self.book):
            self.say(f"recovering {due.stage}: {due.kind.value} ({BY_THE_WATCHER})")
            message = await recover(self._actions(), self.config, self.name, due, self.book, now)
            self.say(f"{message.title}: {message.body.splitlines()[0]}")
            await self.sender.send(self.policy.capped([message], now), now)

    def _actions(self):
        """The action layer, answering for the watcher: it confirms what the preflight lets run and
        declines, with the reason, what it blocks (a watcher never overrides)."""
        from samai.console.core.actions import Actions, Decision
        from samai.console.core.audit import AuditLog
        from samai.console.core.paths import audit_log

        async def confirm(plan):
            if plan.blocked:
                errors = "; ".join(c.text for c in plan.checks if c.severity == "error")
                return Decision.declined(plan, f"the preflight blocks it (a watcher never overrides): {errors}")
            return Decision.confirmed(plan, BY_THE_WATCHER)

        return Actions(self.session.connected_box(), self.config, AuditLog(audit_log()), readonly=self.readonly,
                       confirm=confirm)

    async def _seed(self) -> None:
        """What an earlier watcher of this box left: the alerts it sent (not sent again) and the
        stages it saw running (one over now is an ended run)."""
        try:
            shared = await self.session.connected_box().watchers()
        except Exception as e:  # the box is not answering yet: the poll says so
            self.last_error = str(e)
            return
        self._seeded = True
        self.policy.adopt(shared.ledger)  # sends nothing it already sent
        self.book = RecoveryBook.of(shared.ledger.get("recoveries"))
        self.state.seed_statuses(ledger_statuses(shared.ledger), ledger_looked_at(shared.ledger))
        self.acked = set(shared.acks)

    def heartbeat(self) -> dict:
        return {"who": self.me.who, "host": self.me.host, "pid": self.me.pid, "since": self.me.since,
                "interval": self.config.watch.interval, "last_poll": self.last_poll,
                "last_sent": self.sender.last_sent, "last_error": self.last_error or self.sender.last_error,
                "sent": self.sender.sent, "held": self.policy.held, "unsent": self.sender.unsent,
                "leading": self.leading}

    def ledger(self) -> dict:
        snap = self.state.snapshot
        return {**self.policy.ledger(), "statuses": self.state.stage_statuses(), "recoveries": self.book.to_json(),
                "at": self.clock(), "box_at": snap.time if snap else None}

    async def _beat(self, now: float) -> WatchShared | None:
        """The heartbeat (and the ledger, if this one leads); None when it could not be written."""
        box = self.session.connected_box()
        try:
            if self.readonly:
                return await box.watchers()
            was = self.leading
            lease = max(LEASE_INTERVALS * self.config.watch.interval, MIN_LEASE_S)
            shared = await box.watch_beat(self.me.id, self.heartbeat(), lease, self.ledger() if was else None)
        except Exception as e:  # the heartbeat is bookkeeping: a failed one is said and the watch goes on
            self.last_error = f"heartbeat: {e}"
            self.say(self.last_error)
            return None
        self.leading = shared.leading
        if shared.leading and not was:
            self.policy.adopt(shared.ledger)  # the last leader's: not sent again
            self.book = RecoveryBook.of(shared.ledger.get("recoveries"))
            self.say("leading: this watcher sends for the box")
        elif was and not shared.leading:
            self.say(f"standing by: watcher {shared.leader} sends for the box")
        return shared

    async def close(self) -> None:
        """The last heartbeat leaves the ledger for the next watcher; then the box is closed."""
        if self.leading and not self.readonly and self.last_poll is not None:
            try:
                await asyncio.wait_for(self.session.connected_box().watch_beat(
                    self.me.id, self.heartbeat(), MIN_LEASE_S, self.ledger(), release=True), 10.0)
            except Exception as e:
                self.say(f"last heartbeat not written: {e}")
        await self.session.close()


ONCE_SETTLE_S = 1.0  # --once: a second poll this much later confirms a run seen gone (ConsoleState._confirm_lost)
ONCE_RETRY_S = 30.0  # --once: how long failed sends are retried before it exits


async def watch(watchers: list[BoxWatcher], *, once: bool = False) -> bool:
    """Every box watched at once, each on its own loop (a silent box delays no other), until
    cancelled; once: one poll each (two while a stage runs), what is due sent, then it returns.
    True when every box answered its last poll."""
    try:
        results = await asyncio.gather(*(_once(w) if once else _forever(w) for w in watchers))
    finally:
        await asyncio.gather(*(asyncio.shield(w.close()) for w in watchers), return_exceptions=True)
    return all(results)


async def _forever(w: BoxWatcher) -> bool:
    from samai.console.core.backoff import Backoff

    backoff = Backoff(w.config.watch.interval)
    while True:
        failed = await w.cycle()
        await w.sender.retry(w.clock())
        if failed is None:
            backoff.answered()
        await asyncio.sleep(backoff.failed() if failed else backoff.interval)


async def _once(w: BoxWatcher) -> bool:
    failed = await w.cycle()
    if failed is None and any(status == "running" for status in w.state.stage_statuses().values()):
        await asyncio.sleep(ONCE_SETTLE_S)
        failed = await w.cycle()
    deadline = w.clock() + ONCE_RETRY_S
    while w.sender.pending and w.clock() < deadline:
        await asyncio.sleep(max(0.1, min(p.due for p in w.sender.pending) - w.clock()))
        await w.sender.retry(w.clock())
    return failed is None
