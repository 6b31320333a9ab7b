"""What gpus.py and gpu_events.py read the GPUs through: NVML itself (nvml.py), or a recording of
it (nvml_replay.py). Apart from both, so that neither imports the other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from .nvml import Nvml
    from .nvml_replay import ReplayNvml

Source = Union["Nvml", "ReplayNvml"]
