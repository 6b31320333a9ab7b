"""One box watched with nobody at the keys: the TUI's BoxSession and ConsoleState, the notify
policy over the state's alerts, the outage rule, and this watcher's share of the box's watch
folder (its heartbeat, the lease to send, the leader's ledger, the acknowledgements).

Only the watcher holding the lease sends, so two watchers of one box send once; the ledger it
leaves lets the next one (a restart, a cron run) go on without sending again. The folder is the
box's, so it is read as untrusted input (trust.py): a lease lapses when its holder stops beating,
a ledger is believed only when this watcher's key sealed it, and a watcher stands by quietly only
for a leader whose live beat that key signed. Under any other leader it stands by and sends the
error-level alerts itself: nothing written on the box keeps a death from being sent."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from samai.console.core import units
from samai.console.core.config import Config
from samai.console.core.feeds import Surroundings
from samai.console.core.session import BoxSession, OpenBox, PollFailed
from samai.console.core.update import StateUpdate
from samai.console.core.watch.ledger import MAX_TOLD, LedgerRead, Told, read_ledger, sealed_ledger
from samai.console.core.watch.policy import Message, NotifyPolicy, OutageWatch, clock, plain
from samai.console.core.watch.recover import BY_THE_WATCHER, RecoveryBook, recover, recoveries_due
from samai.console.core.watch.retry import Death
from samai.console.core.watch.sender import Sender
from samai.console.core.watch.trust import Trust
from samai.remote.model import WatcherBeat, WatchShared

LEASE_INTERVALS = 3  # the lease to send outlives this many missed beats
MIN_LEASE_S = 30.0
MAX_LIVE_S = 900.0  # the box's bound on a lease (box/watchers.py MAX_LEASE_S)

# lead: it sends; standby: a leader this watcher's key vouches for sends; shadow: another leader
# holds the lease (unsigned, another key, or none): this one sends the error-level alerts too.
Role = Literal["lead", "standby", "shadow"]


@dataclass
class Identity:
    """Who this watcher is, as its heartbeat says."""

    id: str
    who: str  # user@host
    host: str
    pid: int = field(default_factory=os.getpid)
    since: float = field(default_factory=time.time)

    @property
    def actor(self) -> str:
        """Who acts when this watcher runs a recovery, as the audit log and a stop's record name it."""
        return f"watcher {self.who} (pid {self.pid})"


def console_command(config: Config) -> str:
    """The command that opens this config's console (a message's fix says to run it)."""
    import shlex

    builtin = config.source.startswith("(built-in")
    return "samai-console" + ("" if builtin else f" --config {shlex.quote(config.source)}")


def live_within(beat: WatcherBeat) -> float:
    """How recent a watcher's beat must be for it to be alive: a few of its intervals, bounded."""
    return min(max(LEASE_INTERVALS * beat.interval, MIN_LEASE_S), MAX_LIVE_S)


class BoxWatcher:
    def __init__(self, name: str, config: Config, open_box: OpenBox, sender: Sender, me: Identity, *,
                 readonly: bool = False, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.time, trust: Trust | None = None) -> None:
        self.name, self.config, self.sender, self.me = name, config, sender, me
        self.readonly, self.clock = readonly, clock
        self.trust = trust or Trust.load()
        self.say = (lambda line: say(f"{name}: {line}")) if name else say
        # The same session as the TUI's: the same feeds (but the box screen's own), the same alerts.
        around = Surroundings(name or None, self._nodes if any(s.nodes for s in config.stages) else None)
        self.session = BoxSession(config, open_box, clock=clock, headless=True, around=around)
        self._multinode = None
        self.policy = NotifyPolicy(config.notify, name, console_command(config))
        self.outage = OutageWatch(name, config.watch.unreachable_after)
        # read-only: it writes no heartbeat and takes no lease, so it sends alone
        self.role: Role = "lead" if readonly else "shadow"
        self.acked: set[str] = set()
        self.book = RecoveryBook()  # the deaths recovered (or not) by policy
        self.last_poll: float | None = None
        self.last_error = ""
        self._seeded = False
        self._leader_said: tuple[str | None, bool] | None = None  # the leader last said in the log, and trusted
        self._leader_seen: str | None = None  # the lease's holder at the last beat
        self._problems_said: tuple[str, ...] = ()
        self.polls = 0  # cycles done (tests wait on it)
        # Every message this watcher sent (with those an earlier leader sealed), the newest MAX_TOLD, for
        # the ledger (the timeline reads it); told_dropped: how many older ones were let go.
        self.told: list[Told] = []
        self.told_dropped = 0
        self._told_of: dict[int, tuple[Message, Told]] = {}  # a message being delivered: its entry

    @property
    def state(self):
        return self.session.state

    @property
    def leading(self) -> bool:
        return self.role == "lead"

    async def cycle(self) -> PollFailed | None:
        """One look (a poll and the reads due beside it), what it calls for sent (by the leader;
        the error-level alerts by a watcher in shadow too), and the heartbeat."""
        await self.before_poll()
        result = await self.session.look_once()
        return await self.polled(result)

    async def before_poll(self) -> None:
        if not self._seeded:
            await self._seed()

    async def reported(self, result: StateUpdate | PollFailed) -> None:
        """What the session reports as it runs: a poll (the heartbeat, what is due sent, recovery),
        or a read beside it (what its alerts call for sent)."""
        if isinstance(result, StateUpdate) and result.beside:
            if self.role != "standby":
                now = self.clock()
                await self._send(self._due(now), now)
            return
        await self.polled(result)
        await self.sender.retry(self.clock())

    def bug(self, e: Exception) -> None:
        self.say(f"internal error: {type(e).__name__}: {e}")

    async def polled(self, result: StateUpdate | PollFailed) -> PollFailed | None:
        self.polls += 1
        now = self.clock()
        if isinstance(result, PollFailed):
            self.last_error = result.error
            if result.bug:
                self.say(f"internal error: {result.error}")
            down = self.outage.failed(result.error, now)
            if down and self.role != "standby":  # the last known leader says it (the box holds the lease)
                await self._send(self.policy.capped([down], now), now)
            return result
        self.last_poll, self.last_error = now, ""
        back = self.outage.answered(now)
        shared = await self._beat(now)
        if shared is not None:
            self._read_acks(shared)
        if self.role != "standby":  # a watcher standing by for a trusted leader sends nothing
            messages = self.policy.capped([back], now) if back else []
            await self._send(messages + self._due(now), now)
        if self.leading:
            await self._recover(now)
        return None

    async def _send(self, messages: list[Message], now: float) -> None:
        await self.sender.send(messages, now, self._told)

    def _told(self, message: Message, receiver: str, now: float) -> None:
        """A receiver took a message: kept (once per message, with every receiver that took it)."""
        mine = self._told_of.get(id(message))
        if mine is None or mine[0] is not message:
            detail = message.body.split("\n", 1)[0] if message.kind == "recovery" else ""
            mine = (message, Told(now, message.kind, message.severity, message.title, message.stage, detail[:300]))
            self._told_of[id(message)] = mine
            self.told.append(mine[1])
            self._keep_told()
            while len(self._told_of) > MAX_TOLD:
                del self._told_of[next(iter(self._told_of))]
        if receiver not in mine[1].to:
            mine[1].to.append(receiver)

    def _keep_told(self) -> None:
        if len(self.told) > MAX_TOLD:
            self.told_dropped += len(self.told) - MAX_TOLD
            self.told = self.told[-MAX_TOLD:]

    def _due(self, now: float, *, wait: bool = True) -> list[Message]:
        snap = self.state.snapshot
        runs = {r.stage: r.fired_at for r in snap.states} if snap else {}
        running = frozenset(name for name, status in self.state.stage_statuses().items() if status == "running")
        alerts = self.state.alerts
        if self.role == "shadow":  # beside a leader it cannot vouch for: what must always go
            alerts = [a for a in alerts if a.severity == "error"]
        return self.policy.due(alerts, self.acked, now, runs, running, wait=wait, only_errors=self.role == "shadow")

    async def flush(self) -> None:
        """What waits for a run's end (its output's alerts) sent now: the watcher ends."""
        if self.role != "standby" and self.last_poll is not None:
            now = self.clock()
            await self._send(self._due(now, wait=False), now)

    async def _recover(self, now: float) -> None:
        """The fixes [watch] recover lets it run, for the deaths that stand (read-only: none)."""
        if self.readonly or not self.config.watch.recover:
            return
        for due in recoveries_due(self.config, self.state.alerts, self.book):
            message = await recover(self._actions(), self.config, self.name, due, self.book, now, self._death(due))
            if message is None:  # the backoff: asked again at a later cycle
                continue
            self.say(f"{message.title}: {message.body.splitlines()[0]}")
            await self._send(self.policy.capped([message], now), now)

    def _death(self, due) -> Death:
        """What the watcher knows of a death it may recover: its cause, its run's last step and
        its log's error-level finding (a training stage's), and whether the disk has room again."""
        from samai.console.core.death import cause_of_death
        from samai.console.core.training.feed import TrainingFeed

        snap, update = self.state.snapshot, self.state.last_update
        rec = snap.state(due.stage) if snap else None
        died = cause_of_death(rec, snap) if rec and snap else None
        cause = "serve_hung" if due.alert.code == "serve_hung" else died.cause if died else "exit"
        training = self.state.feed(TrainingFeed)
        step, anomaly = None, ""
        if training is not None and training.stage == due.stage:
            points = training.check.parser.points
            step = points[-1].step if points else None
            anomaly = next((a.message for a in training.check.anomalies if a.severity == "error"), "")
        room = update is None or update.budget.free > self.config.budget.reserve_gb * (1 << 30)
        return Death(cause, step, anomaly[:200], room)

    def _nodes(self):
        """The connections to the nodes of its multi-node stages (read only: a rank that died is said)."""
        if self._multinode is None:
            from samai.console.core.actions import Decision
            from samai.console.core.audit import AuditLog
            from samai.console.core.multinode.session import MultiNodeSession
            from samai.console.core.paths import audit_log

            async def decline(plan):
                return Decision.declined(plan, "the watcher reads the nodes only", by=self.me.actor)

            self._multinode = MultiNodeSession(self.config, AuditLog(audit_log()), readonly=True, confirm=decline)
        return self._multinode

    def _actions(self):
        """The action layer, answering for the watcher: it confirms what the preflight lets run and
        declines, with the reason, what it blocks (a watcher never overrides)."""
        from samai.console.core.actions import Actions, Decision
        from samai.console.core.audit import AuditLog
        from samai.console.core.paths import audit_log
        from samai.console.core.secret_mask import SecretMask

        async def confirm(plan):
            if plan.blocked:
                errors = "; ".join(c.text for c in plan.checks if c.severity == "error")
                return Decision.declined(plan, f"the preflight blocks it (a watcher never overrides): {errors}",
                                         by=self.me.actor)
            return Decision.confirmed(plan, BY_THE_WATCHER, by=self.me.actor)

        audit = AuditLog(audit_log(), SecretMask.of_config(self.config))  # its secrets masked by place too
        return Actions(self.session.connected_box(), self.config, audit, readonly=self.readonly, confirm=confirm)

    async def _seed(self) -> None:
        """What an earlier watcher of this box left: the alerts it sent (not sent again, when this
        watcher's key sealed its ledger) and the stages it saw running (one over now is an ended run)."""
        try:
            shared = await self.session.connected_box().watchers()
        except Exception as e:  # the box is not answering yet: the poll says so
            self.last_error = str(e)
            return
        self._seeded = True
        read = self._adopt(shared)
        self.state.seed_statuses(read.statuses, read.box_at)
        self._read_acks(shared)

    def _adopt(self, shared: WatchShared) -> LedgerRead:
        """The box's ledger as this watcher may use it (said in the log when its key did not seal it)."""
        read = read_ledger(shared.ledger, self.trust, self.clock())
        if read.why:
            self.say(f"the ledger on the box is {read.why}: what it says was sent is not taken as sent "
                     f"(a watcher holding this machine's watch key wrote none)")
        self.policy.adopt(read)
        if read.trusted:
            self.book = RecoveryBook.of(read.recoveries)
            self._adopt_told(read)
        return read

    def _adopt_told(self, read: LedgerRead) -> None:
        """The messages an earlier leader sealed, before (and beside) this watcher's own: one
        history on the box. Only from a ledger this key sealed: a made-up one is never sealed anew."""
        mine = {(t.at, t.title) for t in self.told}
        self.told = sorted([t for t in read.told if (t.at, t.title) not in mine] + self.told, key=lambda t: t.at)
        self.told_dropped = max(self.told_dropped, read.told_dropped)
        self._keep_told()

    def _read_acks(self, shared: WatchShared) -> None:
        """The alerts acknowledged on the box (no more repeats of them); each new one said once."""
        acks = {k for k in shared.acks if isinstance(k, str) and len(k) <= 1000}
        for key in sorted((acks - self.acked) & set(self.policy.sent))[:20]:
            entry = shared.acks.get(key)
            by = entry.get("by") if isinstance(entry, dict) else ""
            self.say(f"acknowledged on the box by {plain(str(by), 80) or '?'}: {plain(key, 120)}")
        self.acked = acks

    def heartbeat(self, now: float) -> dict:
        return {"who": self.me.who, "host": self.me.host, "pid": self.me.pid, "since": self.me.since,
                "interval": self.config.watch.interval, "last_poll": self.last_poll,
                "last_sent": self.sender.last_sent, "last_error": self.last_error or self.sender.last_error,
                "sent": self.sender.sent, "held": self.policy.held, "unsent": self.sender.unsent,
                "leading": self.leading, **self.trust.sign_beat(self.me.id, now)}

    def ledger(self) -> dict:
        snap = self.state.snapshot
        data = {**self.policy.ledger(), "statuses": self.state.stage_statuses(), "recoveries": self.book.to_json(),
                "at": self.clock(), "box_at": snap.time if snap else None}
        return sealed_ledger(self.trust, data, self.policy.sent, self.told, self.told_dropped)

    async def _beat(self, now: float) -> WatchShared | None:
        """The heartbeat (and the ledger, if this one leads); None when it could not be written."""
        box = self.session.connected_box()
        try:
            if self.readonly:
                return await box.watchers()
            was = self.role
            lease = max(LEASE_INTERVALS * self.config.watch.interval, MIN_LEASE_S)
            shared = await box.watch_beat(self.me.id, self.heartbeat(now), lease,
                                          self.ledger() if was == "lead" else None)
        except Exception as e:  # the heartbeat is bookkeeping: a failed one is said and the watch goes on
            self.last_error = f"heartbeat: {e}"
            self.say(self.last_error)
            return None
        self._say_problems(shared)
        if shared.leading:
            if was != "lead":
                self._adopt(shared)  # the last leader's: not sent again
                self.say(self._took_over(shared))
            self.role = "lead"
        else:
            self.role = self._standing_by(shared, now)
            if self.role == "standby" and was != "standby":
                self.policy.sent.clear()  # the leader's ledger says what was sent, from now on
        self._leader_seen = shared.leader
        return shared

    def _took_over(self, shared: WatchShared) -> str:
        before = self._leader_seen
        gone = shared.beat_of(before) if before and before != self.me.id else None
        self._leader_said = (self.me.id, True)
        if gone is None:
            return "leading: this watcher sends for the box"
        return (f"leading: watcher {plain(gone.who or gone.id, 80)} stopped beating (its last beat "
                f"{units.duration(shared.now - gone.written)} ago): this watcher sends for the box")

    def _standing_by(self, shared: WatchShared, now: float) -> Role:
        """standby when a leader this watcher's key vouches for beats; shadow otherwise. Said in
        the log whenever who leads, or whether it is vouched for, changes."""
        beat = shared.beat_of(shared.leader)
        trusted = beat is not None and self.trust.signed(beat, now, live_within(beat))
        if self._leader_said != (shared.leader, trusted):
            self._leader_said = (shared.leader, trusted)
            if shared.leader is None:
                self.say("no watcher holds the lease: this watcher sends the error-level alerts")
            else:
                who = plain(beat.who or beat.id, 80) if beat else plain(shared.leader, 80)
                since = f" since {clock(shared.leader_since)}" if shared.leader_since is not None else ""
                words = f"standing by: watcher {who} leads{since}"
                if not trusted:
                    words += ("; its beat is not signed with this machine's watch key, so this watcher sends "
                              "the error-level alerts too")
                self.say(words)
        return "standby" if trusted else "shadow"

    def _say_problems(self, shared: WatchShared) -> None:
        if shared.problems != self._problems_said:
            self._problems_said = shared.problems
            for problem in shared.problems:
                self.say(f"the box's watch folder: {plain(problem, 200)}")

    async def close(self) -> None:
        """What waits is sent; the last heartbeat leaves the ledger for the next watcher; then the
        box is closed."""
        try:
            await asyncio.wait_for(self.flush(), 30.0)
        except Exception as e:
            self.say(f"not sent before the end: {e}")
        if self.leading and not self.readonly and self.last_poll is not None:
            try:
                await asyncio.wait_for(self.session.connected_box().watch_beat(
                    self.me.id, self.heartbeat(self.clock()), MIN_LEASE_S, self.ledger(), release=True), 10.0)
            except Exception as e:
                self.say(f"last heartbeat not written: {e}")
        await self.session.close()
        if self._multinode is not None:
            await self._multinode.close()


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
    await w.session.run(w.reported, w.bug, before=w.before_poll)  # the TUI's loop: polls, reads, backoff
    return True


async def _once(w: BoxWatcher) -> bool:
    failed = await w.cycle()
    if failed is None and any(status == "running" for status in w.state.stage_statuses().values()):
        await asyncio.sleep(ONCE_SETTLE_S)
        failed = await w.cycle()
    await w.flush()  # nothing waits for a next poll that will not come
    deadline = w.clock() + ONCE_RETRY_S
    while w.sender.pending and w.clock() < deadline:
        await asyncio.sleep(max(0.1, min(p.due for p in w.sender.pending) - w.clock()))
        await w.sender.retry(w.clock())
    return failed is None
