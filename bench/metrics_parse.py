"""A pathological /metrics body: what the console's read of it costs, vs prometheus_client's parser
over the whole body (how it was read before), in the same run.

    python bench/metrics_parse.py [--kib 256] [--runs 9]

The body is what the probe may bring back from a serving port (its bound is 256 KiB): histograms
by the hundred, labelled by model, around vLLM's five figures. The console parses only its
figures' lines (console/core/serving/metrics.py read_lines) and does it in a worker thread the
session runs before a poll is folded in, so neither figure below is spent on the event loop now;
the ratio says how much less work each poll with a serving port does. Printed: medians of --runs,
the ratio, and that both read the same figures.
"""

from __future__ import annotations

from harness import Timings, argument_parser
from prometheus_client.parser import text_string_to_metric_families

from samai.console.core.serving.metrics import parse_metrics
from samai.remote.box.serving import MAX_BODY

FIGURES = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 2\n"
           "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 1\n"
           "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{model_name=\"m\"} 4096\n"
           "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{model_name=\"m\"} 8192\n"
           "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n")

BEFORE, NOW = "the whole body parsed (before)", "the figures' lines parsed (now)"


def body(kib: int) -> str:
    lines, i = [], 0
    size = len(FIGURES)
    while size + 128 < kib * 1024:
        family = f"vllm:request_latency_{i // 40}_seconds"
        line = f'{family}_bucket{{le="{(i % 40) * 0.05:.2f}",model_name="model-{i % 7}"}} {i}\n'
        if i % 40 == 0:
            line = f"# HELP {family} a histogram the console does not read\n# TYPE {family} histogram\n{line}"
        lines.append(line)
        size += len(line)
        i += 1
    half = len(lines) // 2
    return "".join(lines[:half]) + FIGURES + "".join(lines[half:])


def whole(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def main(kib: int, runs: int) -> None:
    text = body(kib)
    t = Timings()
    for _ in range(runs):  # interleaved, so the machine's noise weighs on both alike
        before = t.time(BEFORE, whole, text)
        ours = t.time(NOW, parse_metrics, text)
    assert not isinstance(ours, str) and ours.running == before["vllm:num_requests_running"] \
        and ours.generation_tokens == before["vllm:generation_tokens_total"], (ours, before)
    print(f"a {len(text) / 1024:.0f} KiB /metrics body (the probe's bound: {MAX_BODY // 1024} KiB), medians of {runs}:")
    for name in t.seconds:
        print(f"  {name:<34} {t.median(name) * 1000:8.2f} ms")
    print(f"ratio now / before: x{t.ratio(NOW, BEFORE):.3f} (and now off the event loop)")


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--kib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    main(args.kib, args.runs)
