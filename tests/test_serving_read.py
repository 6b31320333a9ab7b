"""Reading a serving engine's monitoring answers (console/core/serving/metrics.py): a real llama-server's,
recorded (tests/data/serving), vLLM's names as its prometheus_client registry writes them, older
llama-server slot shapes, and anything at all, fuzzed."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from samai.console.core.serving.metrics import (
    EngineMetrics,
    ServingPoint,
    ServingSeries,
    Slot,
    decoded_in_flight,
    kv_use,
    parse_metrics,
    parse_props,
    parse_slots,
)

RECORDED = Path(__file__).parent / "data" / "serving" / "llamacpp"


def recorded(state: str) -> tuple[EngineMetrics, tuple[Slot, ...]]:
    metrics = parse_metrics((RECORDED / f"{state}.metrics.txt").read_text())
    slots = parse_slots((RECORDED / f"{state}.slots.json").read_text())
    assert isinstance(metrics, EngineMetrics) and isinstance(slots, tuple), (metrics, slots)
    return metrics, slots


def test_a_real_llama_server_busy_with_one_request_deferred() -> None:
    metrics, slots = recorded("busy")
    assert (metrics.engine, metrics.running, metrics.waiting) == ("llama.cpp", 2, 1)
    assert metrics.generation_tokens == 0  # its requests' tokens reach the counter only when they end
    assert [s.processing for s in slots] == [True, True] and all(s.n_ctx == 256 for s in slots)
    assert decoded_in_flight(slots) == sum(s.decoded or 0 for s in slots) > 0
    assert kv_use(slots) == sum(s.context_used or 0 for s in slots) / 512


def test_a_real_llama_server_idle_then_done() -> None:
    idle, idle_slots = recorded("idle")
    done, done_slots = recorded("done")
    assert (idle.running, idle.generation_tokens, kv_use(idle_slots)) == (0, 0, 0)
    assert done.generation_tokens == 360 and done.running == 0  # 3 requests of 120 tokens
    assert kv_use(done_slots) == 0  # the slots keep their cached prompts, used by no request
    assert all(s.context_used for s in done_slots)


def test_progress_is_continuous_when_requests_end() -> None:
    """The counter takes a request's tokens as it ends, when they leave the slots: the sum moves on."""
    series = ServingSeries()
    for at, state in ((0.0, "idle"), (1.0, "busy"), (20.0, "done")):
        series.add(ServingPoint.of(at, *recorded(state)))
    assert [p.progress for p in series.points] == [0, decoded_in_flight(recorded("busy")[1]), 360]
    generation, prompt = series.rates()
    assert generation is not None and generation > 0 and prompt is not None and prompt > 0


def test_a_slot_near_its_context_limit() -> None:
    _, slots = recorded("ctx_near_full")
    [full] = [s for s in slots if s.processing]
    assert full.context_used == 241 and full.n_ctx == 256 and full.decoded == 235


def test_props_name_the_model_and_its_context() -> None:
    props = parse_props((RECORDED / "idle.props.json").read_text())
    assert not isinstance(props, str)
    assert (props.model, props.n_ctx, props.total_slots) == ("model.gguf", 256, 2)


def test_an_older_llama_server_s_slots() -> None:
    """Older builds: `state` 0/1 for is_processing, next_token an object, the context in n_past
    (the shape in llama.cpp's server README before `is_processing`)."""
    raw = json.dumps([{"id": 0, "id_task": 7, "n_ctx": 2048, "state": 1, "n_past": 530,
                       "next_token": {"has_next_token": True, "n_remain": 200, "n_decoded": 312}},
                      {"id": 1, "n_ctx": 2048, "state": 0, "next_token": {"n_remain": -1, "n_decoded": 0}}])
    busy, idle = parse_slots(raw)  # type: ignore[misc]
    assert (busy.processing, busy.context_used, busy.decoded, busy.remaining) == (True, 530, 312, 200)
    assert (idle.processing, idle.remaining) == (False, -1)
    assert kv_use((busy, idle)) == 530 / 4096


def _vllm_text(kv_name: str) -> str:
    """vLLM's /metrics as its own prometheus_client registry writes it: its names, labelled by model."""
    registry = CollectorRegistry()
    labels = ["model_name"]
    for name, value in (("vllm:num_requests_running", 3), ("vllm:num_requests_waiting", 5), (kv_name, 0.42)):
        Gauge(name, name, labels, registry=registry).labels("tiny").set(value)
    for name, value in (("vllm:prompt_tokens", 1200), ("vllm:generation_tokens", 3400)):
        Counter(name, name, labels, registry=registry).labels("tiny").inc(value)
    return generate_latest(registry).decode()


def test_vllm_s_metrics_under_either_name_of_its_kv_gauge() -> None:
    for kv_name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        m = parse_metrics(_vllm_text(kv_name))
        assert m == EngineMetrics("vllm", prompt_tokens=1200, generation_tokens=3400, running=3, waiting=5,
                                  kv_use=0.42), kv_name


def test_what_is_not_an_engine_s_metrics_is_said() -> None:
    assert isinstance(parse_metrics("vllm:num_requests_running{ 1"), str)  # a line of a figure read, broken
    assert parse_metrics("x{ 1") == EngineMetrics("")  # another metric's line is not parsed, broken or not
    assert parse_metrics("# nothing here\nother_metric 1\n") == EngineMetrics("")
    assert parse_slots("{}") == "not a list of slots" and parse_slots("[") == "not JSON: JSONDecodeError"
    assert isinstance(parse_props("[1]"), str)


def _points(*rows: tuple[float, float | None, float | None]) -> ServingSeries:
    series = ServingSeries()
    for at, progress, running in rows:
        series.add(ServingPoint(at, progress, 10.0, running, 0.0, None))
    return series


def test_a_stall_is_timed_from_the_last_progress_while_requests_run() -> None:
    assert _points((0, 5, 1), (3, 9, 1), (6, 9, 1), (9, 9, 1)).stalled_for() == 6  # since 3
    assert _points((0, 5, 1), (3, 9, 1)).stalled_for() is None  # it progressed at the last poll
    assert _points((0, 9, 0), (3, 9, 0)).stalled_for() is None  # idle is not stalled
    assert _points((0, 9, 0), (3, 9, 1), (8, 9, 1)).stalled_for() == 5  # from when requests came


def test_a_counter_that_went_back_is_a_restart_not_a_negative_rate() -> None:
    assert _points((0, 500, 1), (2, 10, 1)).rates() == (None, 0.0)
    assert _points((0, 500, 1), (2, 700, 1)).rates() == (100.0, 0.0)
    series = _points((5, 1, 1))
    series.add(ServingPoint(5, 9, 10.0, 1, 0, None))  # the same time again: not a delta
    assert len(series.points) == 1


def test_deferred_requests_growing() -> None:
    series = ServingSeries()
    for at, waiting in enumerate((0, 1, 2, 3)):
        series.add(ServingPoint(at, 0, 0, 2, waiting, None))
    assert series.waiting_growing(3) and not series.waiting_growing(4)
    series.add(ServingPoint(9, 0, 0, 2, 3, None))
    assert not series.waiting_growing(3)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
                        st.sampled_from(["id", "n_ctx", "is_processing", "state", "n_prompt_tokens", "n_past",
                                         "next_token", "n_decoded", "n_remain", "model_path", "total_slots",
                                         "default_generation_settings", "build_info"]) | st.text(max_size=8),
                        inner, max_size=8), max_leaves=30)
NAMES = st.sampled_from(["llamacpp:tokens_predicted_total", "llamacpp:requests_processing", "vllm:num_requests_waiting",
                         "vllm:kv_cache_usage_perc", "x"])


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_is_read_or_said_never_raised(value: object) -> None:
    raw = json.dumps(value)
    slots = parse_slots(raw)
    assert isinstance(slots, str) or all(isinstance(s, Slot) for s in slots)
    if not isinstance(slots, str):
        use = kv_use(slots)
        assert use is None or 0 <= use <= 1
        ServingPoint.of(0.0, None, slots)
    parse_props(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NAMES, st.text(max_size=12), st.text(max_size=12)), max_size=8), st.text(max_size=40))
def test_any_text_is_read_or_said_never_raised(lines: list[tuple[str, str, str]], noise: str) -> None:
    text = "\n".join(f"{name}{{l=\"{label}\"}} {value}" for name, label, value in lines) + "\n" + noise
    got = parse_metrics(text)
    assert isinstance(got, (str, EngineMetrics))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_nan=False), st.one_of(st.none(), st.floats(allow_nan=False)),
                          st.one_of(st.none(), st.floats(allow_nan=False))), max_size=12))
def test_any_series_gives_a_stall_and_rates_never_negative(rows: list[tuple[float, float | None, float | None]]) \
        -> None:
    series = _points(*rows)
    stalled = series.stalled_for()
    assert stalled is None or stalled > 0
    assert all(r is None or r >= 0 for r in series.rates())
    series.waiting_growing(3)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_serving_section_of_a_reply_is_kept_or_left_out_never_raised(value: object) -> None:
    from samai.remote.model import PortAnswers, serving_answers

    for got in (serving_answers(value), serving_answers([{"port": 18080, "answers": value}]),
                serving_answers([{"port": 18080, "answers": {"/health": value}}])):
        assert all(isinstance(p, PortAnswers) and 0 < p.port < 65536 for p in got)
        for p in got:
            assert all(a.status is None or 100 <= a.status < 1000 for a in p.answers)
