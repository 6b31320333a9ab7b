"""The box's GPUs, one compact row each (the nvitop way): index, name, a utilization bar, a
memory bar with used/total, temperature, power draw/limit, and what slows it down; or why
there are none. Names and errors come from the box: literal text, control characters shown."""

from __future__ import annotations

from textual.content import Content

from samai.remote.model import Gpu, GpuReading
from samai.remote.visible import visible
from samai.widgets.pane import Pane, set_subtitle

BAR_WIDTH = 10
NAME_WIDTH = 22


def bar(fraction: float | None, width: int = BAR_WIDTH) -> list[tuple[str, str]]:
    """A bar of `width` cells, coloured by how full it is; `?` cells when unknown."""
    if fraction is None:
        return [("?" * width, "$foreground 50%")]
    fraction = min(max(fraction, 0.0), 1.0)
    cells = round(width * fraction)
    style = "$error" if fraction > 0.9 else "$warning" if fraction > 0.75 else "$success"
    return [("█" * cells, style), ("·" * (width - cells), "$foreground 40%")]


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def _name(gpu: Gpu) -> str:
    name = visible(gpu.name or "?").removeprefix("NVIDIA ")
    return name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…"


def gpu_row(gpu: Gpu) -> Content:
    """One GPU in one line."""
    head: list = [(f"{gpu.index:>2} ", "bold"), (f"{_name(gpu):<{NAME_WIDTH}} ", "")]
    if gpu.error:
        return Content.assemble(*head, (visible(f"unreadable: {gpu.error}"), "$error"))
    util = None if gpu.util_gpu is None else gpu.util_gpu / 100
    temp = "?" if gpu.temperature is None else f"{gpu.temperature}°C"
    draw = "?" if gpu.power_draw is None else f"{gpu.power_draw:.0f}"
    limit = "?" if gpu.power_limit is None else f"{gpu.power_limit:.0f}"
    parts: list = [*head, "util ", *bar(util), f" {'?' if util is None else gpu.util_gpu:>3}% ",
                   "mem ", *bar(gpu.memory_fraction), f" {_gib(gpu.memory_used)}/{_gib(gpu.memory_total)}G ",
                   (f"{temp:>5} ", "$warning" if (gpu.temperature or 0) >= 85 else ""), f"{draw}/{limit}W"]
    if gpu.slowdowns:
        parts.append((visible(" · " + ",".join(gpu.slowdowns)), "$warning"))
    if gpu.ecc_uncorrected:
        parts.append((f" · ECC {gpu.ecc_uncorrected}", "$error"))
    return Content.assemble(*parts)


def gpu_lines(reading: GpuReading) -> Content:
    """The pane's text: a row per GPU, or `no GPU: <reason>`."""
    if not reading.gpus:
        return Content.assemble(("no GPU: ", "$foreground 60%"), visible(reading.error or "none found"))
    return Content("\n").join(gpu_row(g) for g in reading.gpus)


class GpuPane(Pane):
    DEFAULT_CSS = """
    GpuPane {
        height: auto; max-height: 10; padding: 0 1; overflow-y: auto;
        border: round $foreground 25%; border-title-color: $primary; border-subtitle-color: $foreground 70%;
    }
    """

    def show(self, reading: GpuReading) -> None:
        """A reply without a GPU section (an older probe, a recording) hides the pane."""
        self.display = bool(reading.gpus or reading.error)
        set_subtitle(self, f"driver {reading.driver}" if reading.driver else "")
        self.show_content(gpu_lines(reading))
