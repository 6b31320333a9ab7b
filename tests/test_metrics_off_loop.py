"""A serving port's /metrics body costs what its figures' lines cost, is parsed off the event loop,
and a body read in part says so (issue 49, item 6).

A body is server text: a 256 KiB one of other metrics (histograms by the hundred, a hostile
holder of the port) took 0.1-0.5 s of the parser, on the event loop, every 3 s per port. Now only
the lines of the figures read are parsed (their samples, their families' HELP and TYPE lines),
the first MAX_METRIC_LINES of them, in a worker thread the session runs before the poll is folded
in; what is left out, or cut by the probe's bound, is said in the serve pane's note."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from samai.console.core.serving import watch as serving_watch
from samai.console.core.serving.metrics import MAX_METRIC_LINES, EngineMetrics, parse_metrics
from samai.console.core.serving.watch import ServingWatch
from samai.console.core.session import BoxSession, PollFailed
from samai.remote import model
from samai.remote.model import EndpointAnswer, PortAnswers
from samai.widgets.serving import serving_block
from tests.test_serving_watch import PORT, answers, cfg, snap

FIGURES = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
           "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter"}
OTHER = st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True).filter(lambda n: not n.startswith("vllm"))
LABEL = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


def _registry(figures: dict[str, list[tuple[str, float]]], others: dict[str, list[tuple[str, float]]]) -> bytes:
    """vLLM's figures and other metrics, as a prometheus_client registry writes them."""
    registry = CollectorRegistry()
    for name, samples in figures.items():
        kind = Counter if FIGURES[name] == "counter" else Gauge
        metric = kind(name, "a figure read", ["model_name"], registry=registry)
        for label, value in samples:
            metric.labels(label).inc(value) if kind is Counter else metric.labels(label).set(value)
    for i, (name, samples) in enumerate(others.items()):
        histogram = Histogram(f"{name}_h{i}", "another metric", ["model_name"], registry=registry)
        for label, value in samples:
            histogram.labels(label).observe(value)
    return generate_latest(registry)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FIGURES)), st.lists(st.tuples(LABEL, st.floats(0, 1e6)), min_size=1,
                                                                   max_size=3, unique_by=lambda t: t[0]),
                       min_size=1),
       st.dictionaries(OTHER, st.lists(st.tuples(LABEL, st.floats(0, 1e6)), min_size=1, max_size=3,
                                       unique_by=lambda t: t[0]), max_size=6))
def test_other_metrics_beside_the_figures_change_nothing_read(figures, others) -> None:
    alone = parse_metrics(_registry(figures, {}).decode())
    assert isinstance(alone, EngineMetrics) and alone.engine == "vllm"
    assert parse_metrics(_registry(figures, others).decode()) == alone


def _body(figure_lines: int, filler_kib: int) -> str:
    filler = "".join(f'other_latency_bucket{{le="{i}",model_name="m{i}"}} {i}\n' for i in range(filler_kib * 20))
    figures = "".join(f'vllm:num_requests_running{{model_name="m{i}"}} 1\n' for i in range(figure_lines))
    return f"# TYPE vllm:num_requests_running gauge\n{filler}{figures}vllm:generation_tokens_total 7\n"


def _view(body: str, *, truncated: bool = False):
    busy = answers("busy")
    port = PortAnswers(PORT, tuple(EndpointAnswer("/metrics", 200, body, 0.01, truncated=truncated)
                                   if a.path == "/metrics" else a for a in busy.answers))
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, port))
    return watch.views[PORT]


def test_a_quarter_megabyte_of_other_metrics_is_not_parsed_and_the_figures_are_read() -> None:
    body = _body(3, 256)
    assert len(body) > 256 * 1024
    view = _view(body)
    assert view.metrics == EngineMetrics("vllm", generation_tokens=7, running=3) and view.metrics_note == ""


def test_figures_past_the_line_bound_are_said_left_out_never_cut_silently() -> None:
    view = _view(_body(MAX_METRIC_LINES + 500, 1))
    assert view.metrics is not None and view.metrics.running == MAX_METRIC_LINES - 1  # its TYPE line counts
    assert view.metrics.left_out == 502  # 501 running lines and the generation line past the bound
    said = f"/metrics: 502 lines of its figures past the first {MAX_METRIC_LINES} not read"
    assert view.metrics_note == said and said in serving_block(view).plain


def test_a_body_cut_at_the_probes_bound_is_said() -> None:
    view = _view(_body(1, 2), truncated=True)
    assert view.metrics is not None and "cut at the probe's bound: figures after it missing" in view.metrics_note
    assert "cut at the probe's bound" in serving_block(view).plain


class _Canned:
    """A box whose every snapshot is the one given (the session asks it as it asks any box)."""

    def __init__(self, snapshot) -> None:
        self.snapshot_ = snapshot

    async def snapshot(self, **request):
        return replace(self.snapshot_, logs=[model.LogChunk(c.path, missing=True) for c in request["logs"]])

    async def close(self) -> None:
        pass


def test_the_session_parses_the_metrics_bodies_in_a_worker_thread(monkeypatch) -> None:
    threads: list[int] = []
    real = serving_watch.parse_metrics

    def recorded(text: str):
        threads.append(threading.get_ident())
        return real(text)

    monkeypatch.setattr(serving_watch, "parse_metrics", recorded)

    async def poll() -> tuple[int, object]:
        session = BoxSession(cfg(), lambda _cfg: _Canned(snap(100.0, answers("busy"))), headless=True)  # type: ignore[arg-type,return-value]
        update = await session.poll_once()
        assert not isinstance(update, PollFailed), update.error
        return threading.get_ident(), update

    loop_thread, update = asyncio.run(poll())
    assert threads and loop_thread not in threads, "a /metrics body was parsed on the event loop"
    from samai.console.core.serving.feed import ServingReadings

    [view] = update.view(ServingReadings).servers  # type: ignore[union-attr]
    assert view.metrics is not None and view.metrics.engine == "llama.cpp"
