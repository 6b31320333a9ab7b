"""The running servers as an operator sees them: each serving port's answers read into a view
(health and its latency, tokens/s from counter deltas, requests running and deferred, the slots,
KV use, the model), a short history, and the findings: `serve_hung` (requests in flight without
progress, or /health silent, for [serve] hung_after_s while the stage runs), `serve_queue`
(deferred requests growing) and `ctx_full` (a slot at its context limit).

The ports are those a running serve-role stage declares, asked at most every [serve] every_s.
Like the GPU watch, one watch is kept across polls (the TUI's, the watcher's); `doctor` has a
fresh one and so judges one reading alone."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from samai.console.core.config import Config
from samai.console.core.fixes import FixAction
from samai.console.core.kinds import ActionKind
from samai.console.core.problems import Finding
from samai.console.core.serving.metrics import (
    MAX_METRIC_LINES,
    EngineMetrics,
    Props,
    ServingPoint,
    ServingSeries,
    Slot,
    kv_use,
    parse_metrics,
    parse_props,
    parse_slots,
)
from samai.remote.model import EndpointAnswer, PortAnswers, Snapshot

CANARY_EVERY_S = 60.0  # an idle server is sent a 1-token request at most this often
HISTORY = 60  # readings kept per port: a few minutes at the default pace, enough for a stall to show
CTX_FULL_MARGIN = 4  # a slot within this many tokens of its n_ctx is at its limit
T = TypeVar("T")


@dataclass(frozen=True)
class ServingView:
    """One port at its last reading: what the pane shows and `snapshot --json` carries."""

    port: int
    stage: str
    at: float  # the box's time of the reading
    health: str  # "ok", "loading", "HTTP 500", or why there is no answer
    health_ok: bool
    health_seconds: float | None
    metrics: EngineMetrics | None
    metrics_note: str  # why some figures are missing ("" when /metrics answered)
    slots: tuple[Slot, ...] = ()
    slots_note: str = ""
    props: Props | None = None
    generation_tps: float | None = None
    prompt_tps: float | None = None
    stalled_s: float | None = None  # requests in flight without progress this long
    silent_s: float | None = None  # /health unanswered this long
    kv_use: float | None = None
    history: tuple[float | None, ...] = ()  # generation tokens/s, oldest first
    canary: str = ""  # the last 1-token request sent while idle: "ok", "HTTP 404", or why no answer
    canary_waiting_s: float | None = None  # how long the one in flight has gone unanswered

    @property
    def running(self) -> float | None:
        if self.metrics is not None and self.metrics.running is not None:
            return self.metrics.running
        return float(sum(s.processing for s in self.slots)) if self.slots else None

    @property
    def waiting(self) -> float | None:
        return self.metrics.waiting if self.metrics is not None else None

    def to_json(self) -> dict:
        m = self.metrics
        return {
            "port": self.port, "stage": self.stage, "at": self.at, "health": self.health,
            "health_ok": self.health_ok, "health_seconds": self.health_seconds,
            "engine": m.engine if m else None, "metrics_note": self.metrics_note,
            "generation_tokens_per_s": self.generation_tps, "prompt_tokens_per_s": self.prompt_tps,
            "requests_running": self.running, "requests_waiting": self.waiting, "kv_use": self.kv_use,
            "stalled_s": self.stalled_s, "health_silent_s": self.silent_s,
            "model": self.props.model if self.props else None, "n_ctx": self.props.n_ctx if self.props else None,
            "slots": [{"id": s.id, "processing": s.processing, "context_used": s.context_used, "n_ctx": s.n_ctx,
                       "decoded": s.decoded} for s in self.slots],
            "slots_note": self.slots_note, "canary": self.canary, "canary_waiting_s": self.canary_waiting_s,
        }


@dataclass
class _Port:
    series: ServingSeries = field(default_factory=lambda: ServingSeries(HISTORY))
    silent_since: float | None = None
    history: list[float | None] = field(default_factory=list)
    canary_at: float | None = None  # when the last canary was asked for (the console's clock)
    props: Props | None = None  # /props is asked once per server: until it answers, and after a restart
    listener: int | None = None  # the socket inode of the server that answered it


class ServingWatch:
    def __init__(self, config: Config, *, one_look: bool = False) -> None:
        self.config = config
        self.one_look = one_look  # doctor's: a /health that does not answer within the budget is hung at once
        self.asked_at: float | None = None
        self.views: dict[int, ServingView] = {}
        self._ports: dict[int, _Port] = {}
        self._prepared: dict[int, tuple[str, EngineMetrics | str]] = {}  # port -> (its /metrics body, parsed)

    def prepare(self, snap: Snapshot) -> None:
        """Parse the snapshot's /metrics bodies now: the session calls it in a worker thread before
        the snapshot is folded in, so a large body never holds the event loop (observe takes them)."""
        prepared = {}
        for answers in snap.serving:
            got = answers.get("/metrics")
            if got is not None and got.status == 200:
                prepared[answers.port] = (got.body, parse_metrics(got.body))
        self._prepared = prepared

    def _parse_metrics(self, port: int) -> Callable[[str], EngineMetrics | str]:
        prepared = self._prepared.pop(port, None)
        return lambda body: prepared[1] if prepared is not None and prepared[0] is body else parse_metrics(body)

    def serving_ports(self, running: Iterable[str]) -> dict[int, str]:
        """port -> stage, for the serve-role stages running now."""
        names = set(running)
        return {port: s.name for s in self.config.stages if s.role.serves and s.name in names for port in s.ports}

    def due(self, running: Iterable[str], now: float) -> list[int]:
        """The ports to ask in the next snapshot: none unless a serve stage runs and the last ask
        is [serve] every_s old."""
        ports = sorted(self.serving_ports(running))
        if not ports or (self.asked_at is not None and now - self.asked_at < self.config.serve.every_s):
            return []
        self.asked_at = now
        return ports

    def request(self, running: Iterable[str], now: float) -> dict[str, list[int]]:
        """The next snapshot's serving arguments: the ports when due, among them those whose
        server has not yet told its model and context (/props), and the idle ones due a canary."""
        ports = self.due(running, now)
        props = [p for p in ports if p not in self._ports or self._ports[p].props is None]
        return {"serving": ports, "props": props, "canary": self._canary_due(ports, now)}

    def _canary_due(self, ports: list[int], now: float) -> list[int]:
        out = []
        for port in ports:
            view, state = self.views.get(port), self._ports.get(port)
            if view is None or state is None or not view.health_ok or (view.running or 0) > 0:
                continue  # a busy server shows its progress; a silent one is judged by its health
            if state.canary_at is None or now - state.canary_at >= CANARY_EVERY_S:
                state.canary_at = now
                out.append(port)
        return out

    def observe(self, snap: Snapshot) -> None:
        """Fold in the snapshot's serving answers (if it has any); a port whose stage no longer
        runs is forgotten."""
        ports = self.serving_ports(r.stage for r in snap.states if r.status == "running")
        for port in [p for p in self.views if p not in ports]:
            del self.views[port]
            self._ports.pop(port, None)
        listening = {listener.port: listener.inode for listener in snap.listeners}
        for answers in snap.serving:
            if answers.port in ports:
                self._forget_props_of_a_new_server(answers.port, listening.get(answers.port))
                self.views[answers.port] = self._view(answers, ports[answers.port], snap.time)

    def _forget_props_of_a_new_server(self, port: int, inode: int | None) -> None:
        state = self._ports.setdefault(port, _Port())
        if inode is not None and inode != state.listener:  # restarted: perhaps with another model
            state.props, state.listener = None, inode

    def findings(self, snap: Snapshot) -> list[Finding]:
        self.observe(snap)
        out: list[Finding] = []
        for v in self.views.values():
            out += _findings(v, self.config, self.one_look)
            if self._ports[v.port].series.waiting_growing(self.config.serve.queue_polls):
                out.append(Finding("serve_queue", "warning", f"{v.stage} :{v.port}: deferred requests grew at each "
                                   f"of the last {self.config.serve.queue_polls} reads: more is asked of it "
                                   f"than it serves"))
        return out

    def _view(self, answers: PortAnswers, stage: str, at: float) -> ServingView:
        state = self._ports.setdefault(answers.port, _Port())
        health, health_ok, seconds = _health(answers.get("/health"))
        answered = seconds is not None
        state.silent_since = None if answered else (state.silent_since if state.silent_since is not None else at)
        metrics, metrics_note = _read(answers.get("/metrics"), self._parse_metrics(answers.port), "/metrics")
        metrics_note = metrics_note or _metrics_cut(answers.get("/metrics"), metrics)
        slots, slots_note = _read(answers.get("/slots"), parse_slots, "/slots")
        state.props = _read(answers.get("/props"), parse_props, "/props")[0] or state.props
        if metrics is not None and not metrics.engine:
            metrics, metrics_note = None, "/metrics has neither llama.cpp's nor vLLM's names"
        if answered:  # a silent server is no reading: its last figures would read as zero progress
            state.series.add(ServingPoint.of(at, metrics, slots))
        canary, canary_waiting = _canary(answers.get("canary"))
        before = self.views.get(answers.port)
        canary = canary or (before.canary if before else "")  # the last one's word stands until the next
        generation, prompt = state.series.rates() if answered else (None, None)
        state.history = [*state.history[-(HISTORY - 1):], generation]
        return ServingView(
            answers.port, stage, at, health, health_ok, seconds, metrics, metrics_note, slots or (), slots_note,
            state.props, generation, prompt, state.series.stalled_for(),
            at - state.silent_since if state.silent_since is not None else None,
            metrics.kv_use if metrics is not None and metrics.kv_use is not None else kv_use(slots) if slots else None,
            tuple(state.history), canary, canary_waiting)


def _metrics_cut(answer: EndpointAnswer | None, metrics: EngineMetrics | None) -> str:
    """What a /metrics body read in part leaves out: never a silent cut."""
    if metrics is not None and metrics.left_out:
        return f"/metrics: {metrics.left_out} lines of its figures past the first {MAX_METRIC_LINES} not read"
    if metrics is not None and answer is not None and answer.truncated:
        return f"/metrics over {len(answer.body) // 1024} KiB, cut at the probe's bound: figures after it missing"
    return ""


def _health(answer: EndpointAnswer | None) -> tuple[str, bool, float | None]:
    """What /health says, whether it is ok, and its latency (None: no answer)."""
    if answer is None:
        return "not asked", False, None
    if answer.status is None:
        return answer.error or "no answer", False, None
    if answer.status == 200:
        return "ok", True, answer.seconds
    return ("loading" if answer.status == 503 else f"HTTP {answer.status}"), False, answer.seconds


def _canary(answer: EndpointAnswer | None) -> tuple[str, float | None]:
    """What the canary said, and how long the one in flight has waited (None: it answered)."""
    if answer is None:
        return "", None
    if answer.status is None:
        return answer.error or "no answer", answer.seconds
    return ("ok" if answer.status == 200 else f"HTTP {answer.status}") + f" in {answer.seconds * 1000:.0f} ms", None


def _read(answer: EndpointAnswer | None, parse: Callable[[str], T | str], path: str) -> tuple[T | None, str]:
    """An endpoint's body parsed, or None and why not (in words for the pane)."""
    if answer is None:
        return None, f"{path} not asked"
    if answer.status is None:
        return None, f"{path}: {answer.error or 'no answer'}"
    if answer.status == 404 or answer.status == 501:
        hint = " (started without --metrics? an older build?)" if path == "/metrics" else \
            " (this build has no /slots, or it was started with --no-slots)" if path == "/slots" else ""
        return None, f"no {path} (HTTP {answer.status}){hint}"
    if answer.status != 200:
        return None, f"{path}: HTTP {answer.status}"
    got = parse(answer.body)
    if isinstance(got, str):
        return None, f"{path}: {got}" + (" (cut at its size bound)" if answer.truncated else "")
    return got, ""


def _findings(v: ServingView, config: Config, one_look: bool) -> list[Finding]:
    """Each worded the same from poll to poll (a finding's identity is its text): no live figure in it."""
    hung_after = config.serve.hung_after_s
    if one_look and v.silent_s is not None and v.health.startswith("no answer within"):
        return [Finding("serve_hung", "error", f"{v.stage} :{v.port}: /health did not answer within the probe's "
                        f"budget ({v.health}) while its process runs", FixAction(ActionKind.RESTART, v.stage))]
    restart = FixAction(ActionKind.RESTART, v.stage)
    out = []
    if v.stalled_s is not None and v.stalled_s >= hung_after:
        out.append(Finding("serve_hung", "error", f"{v.stage} :{v.port}: requests in flight and no token generated "
                           f"for {hung_after:.0f} s or more: the server is alive but stuck", restart))
    elif v.silent_s is not None and v.silent_s >= hung_after:
        out.append(Finding("serve_hung", "error", f"{v.stage} :{v.port}: /health has not answered for "
                           f"{hung_after:.0f} s or more while its process runs", restart))
    elif v.canary_waiting_s is not None and v.canary_waiting_s >= hung_after:
        out.append(Finding("serve_hung", "error", f"{v.stage} :{v.port}: a 1-token request sent while it was idle "
                           f"has not finished in {hung_after:.0f} s or more: its health answers, its generation "
                           f"does not", restart))
    for s in v.slots:
        if s.processing and s.n_ctx and s.context_used is not None and s.context_used >= s.n_ctx - CTX_FULL_MARGIN:
            out.append(Finding("ctx_full", "warning", f"{v.stage} :{v.port}: slot {s.id} is at its context limit "
                               f"of {s.n_ctx} tokens: its answer will be cut or shifted"))
    return out
