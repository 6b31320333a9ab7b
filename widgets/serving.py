"""The running servers, one block each: health and its latency, the model and its context,
generation and prompt tokens/s (between polls), requests running and deferred, KV use, each
slot's state and context, a tokens/s sparkline so a stall shows, and why a figure is missing.
Hidden while no serve stage runs. The model's name and the notes come from the box: literal text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content

from samai.remote.safe_text import visible
from samai.widgets.gpus import bar
from samai.widgets.pane import Pane, set_subtitle

if TYPE_CHECKING:
    from samai.console.core.serving.watch import ServingView
    from samai.console.core.update import StateUpdate

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24
SLOTS_SHOWN = 4


def sparkline(values: tuple[float | None, ...], width: int = SPARK_WIDTH) -> str:
    """The last `width` values as block heights against their own maximum; a gap as a space."""
    shown = values[-width:]
    top = max((v for v in shown if v is not None), default=0.0)
    return "".join(" " if v is None else SPARKS[0] if top <= 0 else
                   SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in shown)


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def serving_block(v: ServingView) -> Content:
    """One port's lines."""
    health_style = "$success" if v.health_ok else "$error"
    latency = f" {v.health_seconds * 1000:.0f} ms" if v.health_seconds is not None else ""
    model = v.props.model if v.props else ""
    ctx = f" · ctx {v.props.n_ctx}" if v.props and v.props.n_ctx else ""
    slots = f" × {v.props.total_slots}" if v.props and v.props.total_slots else ""
    lines = [Content.assemble((f"{v.stage} :{v.port} ", "bold"), (visible(v.health) + latency, health_style),
                              visible(f" · {model}" if model else "") + ctx + slots)]
    lines.append(Content.assemble(
        "gen ", (_rate(v.generation_tps), "bold"), " tok/s · prompt ", _rate(v.prompt_tps),
        f" tok/s · running {_count(v.running)} · deferred ",
        (_count(v.waiting), "$warning" if (v.waiting or 0) > 0 else ""), " · KV ", *bar(v.kv_use, 6),
        "" if v.kv_use is None else f" {v.kv_use:.0%}"))
    for s in v.slots[:SLOTS_SHOWN]:
        used = "?" if s.context_used is None else str(s.context_used)
        lines.append(Content.assemble(
            ("  ● " if s.processing else "  ○ ", "$success" if s.processing else "$foreground 50%"),
            f"slot {s.id} {used}/{s.n_ctx or '?'}" + (f" · decoded {s.decoded}" if s.processing and s.decoded else "")))
    if len(v.slots) > SLOTS_SHOWN:
        lines.append(Content(f"  … {len(v.slots) - SLOTS_SHOWN} more slots"))
    if v.history:
        lines.append(Content.assemble(("  tok/s ", "$foreground 60%"), (sparkline(v.history), "$primary")))
    if v.canary:
        lines.append(Content.assemble(("  canary ", "$foreground 60%"), visible(v.canary)))
    if v.stalled_s is not None:
        lines.append(Content(f"  no progress for {v.stalled_s:.0f} s with requests in flight").stylize("$error"))
    for note in (v.metrics_note, v.slots_note):
        if note:
            lines.append(Content(visible("  " + note)).stylize("$foreground 60%"))
    return Content("\n").join(lines)


class ServePane(Pane):
    DEFAULT_CSS = """
    ServePane {
        display: none; height: auto; max-height: 40%; padding: 0 1; overflow-y: auto;
        text-wrap: nowrap; text-overflow: ellipsis;
        border: round $foreground 25%; border-title-color: $primary; border-subtitle-color: $foreground 70%;
    }
    """

    def show_update(self, update: StateUpdate) -> None:
        from samai.console.core.serving.feed import ServingReadings

        readings = update.view(ServingReadings)
        if readings is not None:
            self.show(readings.servers)

    def show(self, views: tuple[ServingView, ...]) -> None:
        shown = bool(views)
        if self.display != shown:
            self.display = shown
        if views:
            set_subtitle(self, " · ".join(sorted({v.metrics.engine for v in views if v.metrics} or {"no metrics"})))
            content = Content("\n").join([serving_block(v) for v in views])
            self.show_content(content)  # new figures in as many lines: no layout pass (one took 15 ms)
