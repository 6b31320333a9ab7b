"""A serving engine's monitoring answers, read: llama-server's and vLLM's /metrics (Prometheus
text, through prometheus_client's parser), llama-server's /slots and /props (JSON).

Everything here is written by the server (or whatever holds its port): any text may arrive, and
what does not fit is left out and said, never raised. The shapes differ between builds: a slot
says it works with `is_processing` (newer) or `state == 1` (older), gives `next_token` as a list
(newer) or an object (older), and counts its context in `n_prompt_tokens` (newer: prompt and
decoded together) or `n_past` (older); KV use is no longer exported by llama-server and is derived
from the slots."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_SLOTS = 256  # a /slots answer with more is cut: the pane shows a handful, the sums stay bounded
MAX_METRIC_LINES = 2048  # the read figures' lines taken from one /metrics body (a label set each); more are said

# Each figure by engine: the sample names that give it (the first found wins; vLLM renamed its KV
# gauge from gpu_cache_usage_perc to kv_cache_usage_perc).
LLAMACPP = {
    "prompt_tokens": ("llamacpp:prompt_tokens_total",),
    "generation_tokens": ("llamacpp:tokens_predicted_total",),
    "running": ("llamacpp:requests_processing",),
    "waiting": ("llamacpp:requests_deferred",),
}
VLLM = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_use": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


# The sample names read, and their families' names (a counter's family drops _total): only their
# lines are parsed, so a body's cost is what those lines cost, whatever else it holds.
READ = frozenset(n for table in (LLAMACPP, VLLM) for names in table.values() for n in names)
FAMILIES = READ | {n.removesuffix("_total") for n in READ}


@dataclass(frozen=True)
class EngineMetrics:
    """What one /metrics answer says, summed over its label sets (vLLM labels by model)."""

    engine: str  # "llama.cpp", "vllm", or "" when neither's names are there
    prompt_tokens: float | None = None  # counters: lifetime totals (rates come from their deltas)
    generation_tokens: float | None = None
    running: float | None = None  # gauges: now
    waiting: float | None = None
    kv_use: float | None = None  # 0..1, where the engine exports it
    left_out: int = 0  # lines of the figures read past MAX_METRIC_LINES, not read (the pane says so)


@dataclass(frozen=True)
class Slot:
    id: int
    n_ctx: int | None
    processing: bool
    context_used: int | None  # tokens in the slot's context now (prompt and decoded)
    decoded: int | None  # tokens decoded for its current request
    remaining: int | None  # tokens it may still decode (-1: no limit)


@dataclass(frozen=True)
class Props:
    model: str  # the file name the server was started with, as it says it (box text)
    n_ctx: int | None  # per slot
    total_slots: int | None
    build: str


def parse_metrics(text: str) -> EngineMetrics | str:
    """The engine's figures from its Prometheus text, or what is wrong with the lines that carry
    them (another metric's lines are not parsed: neither their cost nor their errors are ours)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines, left_out = read_lines(text)
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                if isinstance(sample.value, (int, float)) and math.isfinite(sample.value):
                    sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except Exception as e:  # the parser's ValueError, or anything else the text provokes in it
        return f"not Prometheus text: {type(e).__name__}: {str(e)[:120]}"
    for engine, names in (("llama.cpp", LLAMACPP), ("vllm", VLLM)):
        if any(n in sums for ns in names.values() for n in ns):
            found = {figure: next((sums[n] for n in ns if n in sums), None) for figure, ns in names.items()}
            return EngineMetrics(engine, **found, left_out=left_out)
    return EngineMetrics("")


def read_lines(text: str) -> tuple[str, int]:
    """The lines of a /metrics body that carry the figures read (their samples, their families'
    HELP and TYPE lines), the first MAX_METRIC_LINES of them; and how many more there were."""
    kept: list[str] = []
    left_out = 0
    for line in text.split("\n"):  # the format's line end (a label may hold any other)
        words = line.split(None, 3)
        if not words:
            continue
        if words[0] == "#":
            wanted = len(words) >= 3 and words[1] in ("HELP", "TYPE") and words[2] in FAMILIES
        else:
            wanted = words[0].split("{", 1)[0] in READ
        if not wanted:
            continue
        if len(kept) < MAX_METRIC_LINES:
            kept.append(line)
        else:
            left_out += 1
    return "".join(f"{line}\n" for line in kept), left_out


def parse_slots(raw: str) -> tuple[Slot, ...] | str:
    """llama-server's /slots answer, any build's shape, or what is wrong with it."""
    got = _json(raw)
    if isinstance(got, _NotJson):
        return got.said
    if not isinstance(got, list):
        return "not a list of slots"
    slots = [s for s in (_slot(i, item) for i, item in enumerate(got[:MAX_SLOTS])) if s is not None]
    return tuple(slots)


def parse_props(raw: str) -> Props | str:
    got = _json(raw)
    if isinstance(got, _NotJson):
        return got.said
    if not isinstance(got, dict):
        return "not an object"
    settings = got.get("default_generation_settings")
    n_ctx = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    model = got.get("model_alias") or got.get("model_path") or ""
    return Props(_text(model).rsplit("/", 1)[-1], n_ctx, _count(got.get("total_slots")), _text(got.get("build_info")))


def kv_use(slots: tuple[Slot, ...]) -> float | None:
    """The share of all slots' context held by the requests running: llama-server's KV use, which
    it no longer exports (an idle slot's cached prompt is reusable, not in use)."""
    total = sum(s.n_ctx or 0 for s in slots)
    used = sum(min(s.context_used or 0, s.n_ctx or 0) for s in slots if s.processing)
    return used / total if total and all(s.n_ctx for s in slots) else None


def decoded_in_flight(slots: tuple[Slot, ...]) -> int:
    """Tokens decoded so far by the requests still running: llama-server adds a request's tokens
    to its counter only when it ends, so progress is this plus the counter."""
    return sum(s.decoded or 0 for s in slots if s.processing)


def _slot(index: int, item: object) -> Slot | None:
    if not isinstance(item, dict):
        return None
    processing = item.get("is_processing")
    if not isinstance(processing, bool):
        processing = item.get("state") == 1  # older builds: 0 idle, 1 processing
    nxt = item.get("next_token")
    if isinstance(nxt, list):
        nxt = nxt[0] if nxt else None
    nxt = nxt if isinstance(nxt, dict) else {}
    used = _count(item.get("n_prompt_tokens"))
    used = used if used is not None else _count(item.get("n_past"))
    remaining = nxt.get("n_remain")
    sid = _count(item.get("id"))
    return Slot(id=index if sid is None else sid, n_ctx=_count(item.get("n_ctx")), processing=processing,
                context_used=used, decoded=_count(nxt.get("n_decoded")),
                remaining=-1 if remaining == -1 and not isinstance(remaining, bool) else _count(remaining))


@dataclass(frozen=True)
class _NotJson:
    said: str


def _json(raw: str) -> Any:
    """The parsed body, or why it is not JSON (as _NotJson: a body may be any JSON value)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        return _NotJson(f"not JSON: {type(e).__name__}")


def _count(v: Any) -> int | None:
    """A non-negative integer the server sent, or None for anything else."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 else None


def _text(v: Any, limit: int = 200) -> str:
    return v[:limit] if isinstance(v, str) else ""


@dataclass(frozen=True)
class ServingPoint:
    """One poll's figures for one port, as the history keeps them."""

    at: float  # the box's clock
    progress: float | None  # tokens generated: the counter plus what running requests decoded so far
    prompt: float | None  # prompt tokens processed (counter)
    running: float | None
    waiting: float | None
    kv_use: float | None

    @classmethod
    def of(cls, at: float, metrics: EngineMetrics | None, slots: tuple[Slot, ...] | None) -> ServingPoint:
        m = metrics or EngineMetrics("")
        in_flight = decoded_in_flight(slots) if slots else 0
        progress = None if m.generation_tokens is None and not slots else (m.generation_tokens or 0.0) + in_flight
        running = m.running if m.running is not None else \
            float(sum(s.processing for s in slots)) if slots is not None else None
        kv = m.kv_use if m.kv_use is not None else kv_use(slots) if slots else None
        return cls(at, progress, m.prompt_tokens, running, m.waiting, kv)


class ServingSeries:
    """A port's last points: rates from counter deltas between polls (not lifetime averages),
    and how long requests in flight have made no progress."""

    def __init__(self, keep: int = 120) -> None:
        self.keep = keep
        self.points: list[ServingPoint] = []

    def add(self, point: ServingPoint) -> None:
        if self.points and point.at <= self.points[-1].at:
            return  # a clock that went back, or the same poll twice: not a delta
        self.points = [*self.points[-(self.keep - 1):], point]

    def rates(self) -> tuple[float | None, float | None]:
        """Generation and prompt tokens/s between the last two points (None across a restart)."""
        if len(self.points) < 2:
            return None, None
        a, b = self.points[-2], self.points[-1]
        return _rate(a.progress, b.progress, b.at - a.at), _rate(a.prompt, b.prompt, b.at - a.at)

    def stalled_for(self) -> float | None:
        """Seconds that requests have been in flight with no token generated or prompt token
        processed, up to the last point; None while they progress or none run."""
        if not self.points or not (self.points[-1].running or 0) > 0:
            return None
        last = self.points[-1]
        since = last.at
        for p in reversed(self.points[:-1]):
            if not (p.running or 0) > 0 or (p.progress, p.prompt) != (last.progress, last.prompt):
                break
            since = p.at
        return last.at - since if last.at > since else None

    def waiting_growing(self, polls: int) -> bool:
        """Deferred requests grew at each of the last `polls` polls."""
        w = [p.waiting for p in self.points[-(polls + 1):] if p.waiting is not None]
        return len(w) == polls + 1 and all(b > a for a, b in zip(w, w[1:], strict=False))


def _rate(a: float | None, b: float | None, seconds: float) -> float | None:
    if a is None or b is None or not seconds > 0 or b < a:  # b < a: the server restarted, its counters from 0
        return None
    rate = (b - a) / seconds
    return rate if math.isfinite(rate) else None
