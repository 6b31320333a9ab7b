"""Convert a published `nvidia-smi -q -x` output into an NVML recording (remote/box/nvml_replay.py):
what each NVML call the probe makes would have returned on that box, in NVML's own units
(bytes, milliwatts, the clocks event reasons as a bit mask, NVML_VALUE_NOT_AVAILABLE for a
process's memory nvidia-smi shows as N/A). A value nvidia-smi shows as N/A is the call failing
with NOT_SUPPORTED, as NVML answers it (utilization on a GPU in MIG mode, ECC on a GeForce).

    python tests/data/nvml/convert.py            (rewrites every *.json here from xml/, see README.md)
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NOT_SUPPORTED = {"nvml_error": "NOT_SUPPORTED"}
VALUE_NOT_AVAILABLE = 2**64 - 1
MIB = 1024 * 1024
REASON_BITS = {  # nvidia-smi's element suffix -> nvmlClocksEventReason* bit (nvml.h)
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100,
}
SOURCES = {  # recording name -> (the XML file under xml/, where it was published)
    "a100_sxm4_mig": ("a100-sxm4-v12.xml", "influxdata/telegraf plugins/inputs/nvidia_smi/testdata/a100-sxm4-v12.xml"),
    "tesla_t4": ("tesla-t4.xml", "influxdata/telegraf plugins/inputs/nvidia_smi/testdata/tesla-t4.xml"),
    "a10g": ("a10g.xml", "influxdata/telegraf plugins/inputs/nvidia_smi/testdata/a10g.xml"),
    "rtx_3080": ("rtx-3080-v12.xml", "influxdata/telegraf plugins/inputs/nvidia_smi/testdata/rtx-3080-v12.xml"),
    "dual_a5000": ("dual_a5000-v13.xml",
                   "influxdata/telegraf plugins/inputs/nvidia_smi/testdata/dual_a5000-v13.xml"),
}


def number(text: str | None) -> float | None:
    """The number in "67.03 W", "81920 MiB", "27 C", "45 %"; None for N/A and the like."""
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", text or "")
    return float(match.group(1)) if match else None


def first(gpu: ET.Element, *paths: str) -> float | None:
    for path in paths:
        value = number(gpu.findtext(path))
        if value is not None:
            return value
    return None


def or_unsupported(value: Any) -> Any:
    return NOT_SUPPORTED if value is None else value


def utilization(gpu: ET.Element) -> Any:
    util, mem = first(gpu, "utilization/gpu_util"), first(gpu, "utilization/memory_util")
    return NOT_SUPPORTED if util is None or mem is None else [int(util), int(mem)]


def memory(gpu: ET.Element) -> Any:
    used, total = first(gpu, "fb_memory_usage/used"), first(gpu, "fb_memory_usage/total")
    return NOT_SUPPORTED if used is None or total is None else [int(used) * MIB, int(total) * MIB]


def milliwatts(watts: float | None) -> Any:
    return NOT_SUPPORTED if watts is None else int(round(watts * 1000))


def reasons(gpu: ET.Element) -> Any:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return NOT_SUPPORTED
    mask, known = 0, False
    for child in block:
        suffix = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
        if suffix in REASON_BITS and (child.text or "").strip() in ("Active", "Not Active"):
            known = True
            mask |= REASON_BITS[suffix] if child.text.strip() == "Active" else 0
    return mask if known else NOT_SUPPORTED


def ecc(gpu: ET.Element) -> Any:
    """[corrected, uncorrected] of the volatile counters (every memory's, summed), as
    nvmlDeviceGetTotalEccErrors counts them; NOT_SUPPORTED where nvidia-smi shows none."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return NOT_SUPPORTED
    corrected = uncorrected = None
    for element in volatile.iter():
        value = number(element.text)
        if value is None or len(element):
            continue
        tag = element.tag
        is_uncorrected = "uncorrectable" in tag or (tag == "total" and "double" in tag_path(volatile, element))
        if is_uncorrected:
            uncorrected = (uncorrected or 0) + int(value)
        elif "correctable" in tag or tag == "total":
            corrected = (corrected or 0) + int(value)
    return NOT_SUPPORTED if corrected is None and uncorrected is None else [corrected or 0, uncorrected or 0]


def tag_path(root: ET.Element, leaf: ET.Element) -> str:
    """The tags from root down to leaf (the older schema's single_bit/total, double_bit/total)."""
    for parent in root.iter():
        if leaf in list(parent):
            return parent.tag + "/" + leaf.tag
    return leaf.tag


def processes(gpu: ET.Element) -> tuple[list, list]:
    compute: list[list[int]] = []
    graphics: list[list[int]] = []
    for proc in gpu.findall("processes/process_info"):
        pid = number(proc.findtext("pid"))
        if pid is None:
            continue
        used = number(proc.findtext("used_memory"))
        entry = [int(pid), VALUE_NOT_AVAILABLE if used is None else int(used) * MIB]
        kind = (proc.findtext("type") or "").strip()
        if "C" in kind:
            compute.append(entry)
        if "G" in kind:
            graphics.append(list(entry))
    return compute, graphics


def device(gpu: ET.Element) -> dict[str, Any]:
    compute, graphics = processes(gpu)
    draw = first(gpu, "power_readings/power_draw", "gpu_power_readings/power_draw",
                 "gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw")
    limit = first(gpu, "power_readings/enforced_power_limit", "gpu_power_readings/current_power_limit",
                  "gpu_power_readings/enforced_power_limit")
    temperature = first(gpu, "temperature/gpu_temp")
    return {
        "name": or_unsupported(gpu.findtext("product_name")),
        "uuid": or_unsupported(gpu.findtext("uuid")),
        "bus_id": or_unsupported(gpu.findtext("pci/pci_bus_id")),
        "utilization": utilization(gpu),
        "memory": memory(gpu),
        "temperature": or_unsupported(None if temperature is None else int(temperature)),
        "power_usage": milliwatts(draw),
        "power_limit": milliwatts(limit),
        "clocks_event_reasons": reasons(gpu),
        "ecc_errors": ecc(gpu),
        "compute_processes": compute,
        "graphics_processes": graphics,
    }


def convert(xml_text: str, source: str) -> dict[str, Any]:
    root = ET.fromstring(xml_text)
    return {
        "source": source,
        "init": None,
        "driver_version": or_unsupported(root.findtext("driver_version")),
        "devices": [device(gpu) for gpu in root.findall("gpu")],
    }


def main() -> int:
    for name, (xml_name, source) in SOURCES.items():
        recording = convert((HERE / "xml" / xml_name).read_text(), source)
        (HERE / f"{name}.json").write_text(json.dumps(recording, indent=1) + "\n")
        print(f"{name}.json: {len(recording['devices'])} GPU(s) from {xml_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
