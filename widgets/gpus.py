"""The box's GPUs, one compact row each (the nvitop way): index, name, a utilization bar, a
memory bar with used/total, temperature, power draw/limit, and what slows it down; or why
there are none. Names and errors come from the box: literal text, control characters shown."""

from __future__ import annotations

from textual.content import Content

from samai.remote.model import Gpu, GpuReading
from samai.remote.visible import visible
from samai.widgets.pane import Pane, set_subtitle

BAR_WIDTH = 8
NAME_WIDTH = 16
# What holds a GPU back, in a word each (the names are NVML's clocks event reasons).
SLOWDOWN_WORDS = {"sw_power_cap": "power cap", "hw_slowdown": "hw slowdown", "sync_boost": "sync boost",
                  "sw_thermal_slowdown": "hot", "hw_thermal_slowdown": "hot", "hw_power_brake_slowdown": "power brake"}
HEADER = f"   {'name':<{NAME_WIDTH}} {'util':<{BAR_WIDTH + 5}} {'memory':<{BAR_WIDTH + 9}} {'temp':>4} power"


def bar(fraction: float | None, width: int = BAR_WIDTH) -> list[tuple[str, str]]:
    """A bar of `width` cells, coloured by how full it is; `?` cells when unknown."""
    if fraction is None:
        return [("?" * width, "$foreground 50%")]
    fraction = min(max(fraction, 0.0), 1.0)
    cells = round(width * fraction)
    style = "$error" if fraction > 0.9 else "$warning" if fraction > 0.75 else "$success"
    return [("█" * cells, style), ("·" * (width - cells), "$foreground 40%")]


def _memory(used: int | None, total: int | None) -> str:
    """used/total in GiB, as nvitop shows it: 70/80G, 4.2/24G."""
    def gib(n: int | None) -> str:
        return "?" if n is None else f"{n / 2**30:.0f}" if n >= 10 * 2**30 else f"{n / 2**30:.1f}"
    return f"{gib(used)}/{gib(total)}G"


def _name(gpu: Gpu) -> str:
    name = visible(gpu.name or "?").removeprefix("NVIDIA ")
    return name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…"


def _known(value: float | None, spec: str = "") -> str:
    return "?" if value is None else format(value, spec)


def gpu_row(gpu: Gpu) -> Content:
    """One GPU in one line."""
    head: list = [(f"{gpu.index:>2} ", "bold"), f"{_name(gpu):<{NAME_WIDTH}} "]
    if gpu.error:
        return Content.assemble(*head, (visible(f"unreadable: {gpu.error}"), "$error"))
    util = None if gpu.util_gpu is None else gpu.util_gpu / 100
    hot = gpu.temperature is not None and gpu.temperature >= 85
    parts: list = [*head, *bar(util), f"{_known(gpu.util_gpu):>4}% ", *bar(gpu.memory_fraction),
                   f" {_memory(gpu.memory_used, gpu.memory_total):<8}",
                   (f"{_known(gpu.temperature):>3}°C", "$warning" if hot else ""),
                   f" {_known(gpu.power_draw, '.0f')}/{_known(gpu.power_limit, '.0f')}W"]
    words = sorted({SLOWDOWN_WORDS.get(r, r) for r in gpu.slowdowns})
    if words:
        parts.append((visible(" " + ",".join(words)), "$warning"))
    if gpu.ecc_uncorrected:
        parts.append((f" ECC {gpu.ecc_uncorrected}", "$error"))
    return Content.assemble(*parts)


def gpu_lines(reading: GpuReading) -> Content:
    """The pane's text: a header and a row per GPU, or `no GPU: <reason>`."""
    if not reading.gpus:
        return Content.assemble(("no GPU: ", "$foreground 60%"), visible(reading.error or "none found"))
    return Content("\n").join([Content.styled(HEADER, "$foreground 60%"), *(gpu_row(g) for g in reading.gpus)])


class GpuPane(Pane):
    DEFAULT_CSS = """
    GpuPane {
        display: none; height: auto; max-height: 12; padding: 0 1; overflow-y: auto;
        text-wrap: nowrap; text-overflow: ellipsis;
        border: round $foreground 25%; border-title-color: $primary; border-subtitle-color: $foreground 70%;
    }
    """

    def show(self, reading: GpuReading) -> None:
        """A reply without a GPU section (an older probe, a recording) hides the pane."""
        self.display = bool(reading.gpus or reading.error)
        set_subtitle(self, f"driver {reading.driver}" if reading.driver else "")
        self.show_content(gpu_lines(reading))
