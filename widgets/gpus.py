"""The box's GPUs, one compact row each (the nvitop way): index, name, a utilization bar, a
memory bar with used/total, temperature, power draw/limit, and what slows it down; or why
there are none. Names and errors come from the box: literal text, control characters shown."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from textual.content import Content

from samai.remote.safe_text import visible
from samai.widgets.pane import Pane, set_subtitle

if TYPE_CHECKING:
    from samai.console.core.update import StateUpdate
    from samai.remote.model import Gpu, GpuReading

BAR_WIDTH = 8
NARROW_BAR_WIDTH = 6
NAME_WIDTH = 16  # at most; less, or no name, in a narrow pane
MIN_NAME = 6
LEGEND = "util · memory · temp · power"
# What holds a GPU back, in a word each (the names are NVML's clocks event reasons).
SLOWDOWN_WORDS = {"sw_power_cap": "power cap", "hw_slowdown": "hw slowdown", "sync_boost": "sync boost",
                  "sw_thermal_slowdown": "hot", "hw_thermal_slowdown": "hot", "hw_power_brake_slowdown": "power brake"}


def bar(fraction: float | None, width: int = BAR_WIDTH) -> list[tuple[str, str]]:
    """A bar of `width` cells, coloured by how full it is; `?` cells when unknown."""
    if fraction is None or not math.isfinite(fraction):
        return [("?" * width, "$foreground 50%")]
    fraction = min(max(fraction, 0.0), 1.0)
    cells = round(width * fraction)
    style = "$error" if fraction > 0.9 else "$warning" if fraction > 0.75 else "$success"
    return [("█" * cells, style), ("·" * (width - cells), "$foreground 40%")]


def layout(width: int | None) -> tuple[int, int]:
    """The bars' and the name's widths for a row of `width` cells (None: as wide as it likes):
    the numbers always fit before the name does."""
    if width is None:
        return BAR_WIDTH, NAME_WIDTH
    bars = BAR_WIDTH if width >= 2 * BAR_WIDTH + 32 + MIN_NAME + 1 else NARROW_BAR_WIDTH
    room = width - (2 * bars + 32) - 1  # index, the two bars with their numbers, temperature, power
    return bars, min(NAME_WIDTH, room) if room >= MIN_NAME else 0


def _memory(used: int | None, total: int | None) -> str:
    """used/total in GiB, as nvitop shows it: 70/80G, 4.2/24G."""
    def gib(n: int | None) -> str:
        return "?" if n is None else f"{n / 2**30:.0f}" if n >= 10 * 2**30 else f"{n / 2**30:.1f}"
    return f"{gib(used)}/{gib(total)}G"


def _name(gpu: Gpu, width: int) -> str:
    name = visible(gpu.name or "?").removeprefix("NVIDIA ")
    return name if len(name) <= width else name[:width - 1] + "…"


def _known(value: float | None, spec: str = "") -> str:
    return "?" if value is None else format(value, spec)


def gpu_row(gpu: Gpu, width: int | None = None) -> Content:
    """One GPU in one line of `width` cells (more where a slowdown or an ECC count is added)."""
    bars, name_width = layout(width)
    head: list = [(f"{gpu.index:>2} ", "bold")] + ([f"{_name(gpu, name_width):<{name_width}} "] if name_width else [])
    if gpu.error:
        return Content.assemble(*head, (visible(f"unreadable: {gpu.error}"), "$error"))
    util = None if gpu.util_gpu is None else gpu.util_gpu / 100
    hot = gpu.temperature is not None and gpu.temperature >= 85
    parts: list = [*head, *bar(util, bars), f"{_known(gpu.util_gpu):>4}% ", *bar(gpu.memory_fraction, bars),
                   f" {_memory(gpu.memory_used, gpu.memory_total):<8}",
                   (f"{_known(gpu.temperature):>3}°C", "$warning" if hot else ""),
                   f" {_known(gpu.power_draw, '.0f')}/{_known(gpu.power_limit, '.0f')}W"]
    words = sorted({SLOWDOWN_WORDS.get(r, r) for r in gpu.slowdowns})
    if words:
        parts.append((visible(" " + ",".join(words)), "$warning"))
    if gpu.ecc_uncorrected:
        parts.append((f" ECC {gpu.ecc_uncorrected}", "$error"))
    return Content.assemble(*parts)


def gpu_lines(reading: GpuReading, width: int | None = None) -> Content:
    """The pane's text: a row per GPU, or `no GPU: <reason>`."""
    if not reading.gpus:
        return Content.assemble(("no GPU: ", "$foreground 60%"), visible(reading.error or "none found"))
    return Content("\n").join([gpu_row(g, width) for g in reading.gpus])


class GpuPane(Pane):
    """Its rows fit its width: a narrower pane shortens the names, then drops them."""

    DEFAULT_CSS = """
    GpuPane {
        display: none; height: auto; max-height: 30%; padding: 0 1; overflow-y: auto;
        text-wrap: nowrap; text-overflow: ellipsis;
        border: round $foreground 25%; border-title-color: $primary; border-subtitle-color: $foreground 70%;
    }
    """
    _reading: GpuReading | None = None

    def show_update(self, update: StateUpdate) -> None:
        self.show(update.snapshot.gpus)

    def show(self, reading: GpuReading) -> None:
        """A reply without a GPU section (an older probe, a recording) hides the pane."""
        self._reading = reading
        shown = bool(reading.gpus or reading.error)
        if self.display != shown:  # each poll hands a reading in: no restyle when nothing changed
            self.display = shown
        driver = f" · driver {reading.driver}" if reading.driver else ""
        set_subtitle(self, (LEGEND if reading.gpus else "") + driver)
        width = self.content_region.width
        self.show_content(gpu_lines(reading, width or None))

    def on_resize(self) -> None:
        if self._reading is not None:
            self.show(self._reading)
