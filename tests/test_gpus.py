"""The GPUs in the probe: recorded NVML readings (tests/data/nvml) replayed at the NVML boundary,
through the real probe (run by the Box as the console runs it) into model.Snapshot; no library,
a failed init, a lost GPU; a fuzz of the replayed values; NVML initialised once per --serve probe;
Xid and ECC events through NVML's event API, kept by the probe for every poll."""

from __future__ import annotations

import copy
import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote import model
from samai.remote.box import gpu_events, gpus, nvml
from samai.remote.box.gpus import MAX_TEXT, GpuSession, reasons
from samai.remote.box.nvml_replay import CALLS_ENV, REPLAY_ENV, ReplayNvml
from samai.remote.box.probe import Memory, answer
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import unavailable_here

DATA = Path(__file__).parent / "data" / "nvml"
MIB = 1024 * 1024


def recording(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rec: dict[str, Any] | str) -> Path:
    """Point the probes this test starts at a recording; returns the file init calls are counted in."""
    path = DATA / f"{rec}.json" if isinstance(rec, str) else tmp_path / "recording.json"
    if not isinstance(rec, str):
        path.write_text(json.dumps(rec))
    calls = tmp_path / "nvml_calls"
    monkeypatch.setenv(REPLAY_ENV, str(path))
    monkeypatch.setenv(CALLS_ENV, str(calls))
    return calls


def in_process(rec: dict[str, Any], memory: Memory | None = None) -> model.Snapshot:
    """One reply of the real probe (answer(), as --serve calls it) with this recording, parsed;
    a memory given is the probe's from its earlier replies."""
    if memory is None:
        memory = Memory()
        memory.gpus = GpuSession(ReplayNvml(rec))
    raw = json.loads(answer(json.dumps({"processes": False, "states": False}), memory))
    return model.snapshot(raw, 0.0)


# ---------------------------------------------------------------- recorded GPUs through the Box


async def test_a_tesla_t4_with_ecc_and_a_training_process(box: Box, monkeypatch, tmp_path) -> None:
    replay(monkeypatch, tmp_path, "tesla_t4")
    snap = await box.snapshot()
    assert snap.gpus.error is None and snap.gpus.driver == "515.105.01"
    (gpu,) = snap.gpus.gpus
    assert (gpu.index, gpu.name, gpu.uuid, gpu.bus_id) == (
        0, "Tesla T4", "GPU-d37e67a5-91dd-3774-a5cb-99096249601a", "00000000:00:1E.0")
    assert (gpu.util_gpu, gpu.util_memory, gpu.temperature) == (0, 0, 40)
    assert (gpu.memory_used, gpu.memory_total) == (1032 * MIB, 15360 * MIB)
    assert (gpu.power_draw, gpu.power_limit) == (26.78, 70.0)
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (0, 0)
    assert gpu.throttle_reasons == () and gpu.slowdowns == ()
    assert gpu.processes == (model.GpuProcess(pid=5762, used_memory=1005 * MIB, kind="C"),
                             model.GpuProcess(pid=675, used_memory=22 * MIB, kind="G"))


async def test_an_a100_in_mig_mode_reads_without_utilization(box: Box, monkeypatch, tmp_path) -> None:
    replay(monkeypatch, tmp_path, "a100_sxm4_mig")
    (gpu,) = (await box.snapshot()).gpus.gpus
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert (gpu.util_gpu, gpu.util_memory) == (None, None)  # NOT_SUPPORTED in MIG mode: null, not 0
    assert (gpu.memory_used, gpu.memory_total, gpu.temperature) == (50 * MIB, 81920 * MIB, 27)
    assert (gpu.power_draw, gpu.power_limit) == (67.03, 500.0)
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (0, 0) and gpu.processes == ()


async def test_a_consumer_card_has_no_ecc(box: Box, monkeypatch, tmp_path) -> None:
    replay(monkeypatch, tmp_path, "rtx_3080")
    (gpu,) = (await box.snapshot()).gpus.gpus
    assert gpu.name == "NVIDIA GeForce RTX 3080"
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (None, None)
    assert gpu.throttle_reasons == ("gpu_idle",) and gpu.slowdowns == ()
    assert [p.pid for p in gpu.processes] == [835, 1481, 2214, 4044, 42416]
    assert {p.kind for p in gpu.processes} == {"G"}
    assert gpu.memory_fraction == pytest.approx(1128 / 10240)


async def test_two_gpus_and_one_process_holding_both(box: Box, monkeypatch, tmp_path) -> None:
    replay(monkeypatch, tmp_path, "dual_a5000")
    reading = (await box.snapshot()).gpus
    assert [(g.index, g.bus_id) for g in reading.gpus] == [(0, "00000000:81:00.0"), (1, "00000000:C1:00.0")]
    assert reading.holders() == {100477: (22430 + 17246) * MIB}
    assert [g.power_draw for g in reading.gpus] == [6.41, 13.6]


async def test_nvml_is_initialised_once_per_serve_probe(box: Box, monkeypatch, tmp_path) -> None:
    calls = replay(monkeypatch, tmp_path, "a10g")
    for _ in range(3):
        assert (await box.snapshot()).gpus.gpus[0].name == "NVIDIA A10G"
    assert calls.read_text().splitlines() == ["init"]


async def test_no_gpu_section_when_the_request_says_so(monkeypatch, tmp_path) -> None:
    calls = replay(monkeypatch, tmp_path, "a10g")
    raw = json.loads(answer(json.dumps({"processes": False, "gpus": False}), Memory()))
    assert "gpus" not in raw and not calls.exists()
    assert "gpus" in json.loads(answer(json.dumps({"gpus": 1}), Memory()))["error"]


# ---------------------------------------------------------------- no GPU: a reason, never an error


def library_present() -> bool:
    try:
        ctypes.CDLL(nvml.LIBRARY)
    except OSError:
        return False
    return True


async def test_the_real_probe_reads_the_gpus_or_says_why_not(box: Box, monkeypatch) -> None:
    monkeypatch.delenv(REPLAY_ENV, raising=False)
    snap = await box.snapshot()
    assert snap.errors == ()
    if library_present():  # a machine with the NVIDIA driver: its GPUs, or NVML's own reason
        assert snap.gpus.gpus or snap.gpus.error
    else:
        assert snap.gpus.gpus == () and snap.gpus.error is not None
        assert "libnvidia-ml.so.1 not found" in snap.gpus.error


def test_a_library_that_is_not_there_is_a_reason() -> None:
    reply = GpuSession(nvml.Nvml("libnvidia-ml-absent.so.1")).read()
    assert reply["gpus"] == [] and "libnvidia-ml-absent.so.1 not found" in reply["gpu_error"]


@pytest.mark.parametrize(("init", "said"), [("DRIVER_NOT_LOADED", "Driver Not Loaded"),
                                            ("NO_PERMISSION", "Insufficient Permissions")])
def test_an_init_that_fails_is_a_reason(init: str, said: str) -> None:
    snap = in_process({"init": {"nvml_error": init}, "devices": recording("tesla_t4")["devices"]})
    assert snap.gpus.gpus == () and snap.gpus.error == f"NVML: {said}"


def test_a_failed_init_is_tried_again_later_not_every_poll(tmp_path: Path, monkeypatch) -> None:
    calls = tmp_path / "calls"
    source = ReplayNvml({"init": {"nvml_error": "DRIVER_NOT_LOADED"}}, str(calls))
    session = GpuSession(source)
    for _ in range(3):
        assert session.read()["gpu_error"] == "NVML: Driver Not Loaded"
    assert calls.read_text().splitlines() == ["init"]
    source.recording = recording("a10g")  # the driver has been loaded since
    monkeypatch.setattr(gpus, "RETRY_S", 0.0)
    reply = session.read()
    assert reply["gpu_error"] is None and reply["gpus"][0]["name"] == "NVIDIA A10G"
    assert calls.read_text().splitlines() == ["init", "init"]


def test_no_device_is_said() -> None:
    assert in_process({"driver_version": "550.1", "devices": []}).gpus == model.GpuReading(
        error="no NVIDIA GPU found", driver="550.1")


# ---------------------------------------------------------------- incidents, as edits of recordings


def test_a_lost_gpu_is_its_own_entry_and_the_others_read() -> None:
    rec = recording("dual_a5000")
    rec["devices"][0]["handle"] = {"nvml_error": "GPU_IS_LOST"}
    lost, fine = in_process(rec).gpus.gpus
    assert (lost.index, lost.error, lost.name) == (0, "GPU is lost", None)
    assert fine.name == "NVIDIA RTX A5000" and fine.error is None


def test_failed_calls_are_null_fields_not_a_failed_reply() -> None:
    rec = recording("tesla_t4")
    device = rec["devices"][0]
    for key in ("name", "memory", "temperature", "power_usage", "clocks_event_reasons", "compute_processes"):
        device[key] = {"nvml_error": "UNKNOWN"}
    del device["power_limit"]  # an older driver without the call
    (gpu,) = in_process(rec).gpus.gpus
    assert (gpu.name, gpu.memory_used, gpu.temperature, gpu.power_draw, gpu.power_limit) == (None,) * 5
    assert gpu.throttle_reasons is None and gpu.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert gpu.processes == (model.GpuProcess(pid=675, used_memory=22 * MIB, kind="G"),)


def test_ecc_errors_throttling_and_a_context_without_its_memory() -> None:
    rec = recording("a100_sxm4_mig")
    device = rec["devices"][0]
    device["ecc_errors"] = [12, 2]
    device["clocks_event_reasons"] = 0x4 | 0x40 | 0x400  # power cap, HW thermal, and a bit newer than us
    device["compute_processes"] = [[4242, nvml.VALUE_NOT_AVAILABLE], [4243, 3 * MIB]]
    device["graphics_processes"] = [[4242, 7 * MIB]]
    (gpu,) = in_process(rec).gpus.gpus
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (12, 2)
    assert gpu.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown", "0x400")
    assert gpu.slowdowns == gpu.throttle_reasons
    assert gpu.processes == (model.GpuProcess(pid=4242, used_memory=7 * MIB, kind="C+G"),
                             model.GpuProcess(pid=4243, used_memory=3 * MIB, kind="C"))


def test_every_known_reason_has_its_name() -> None:
    assert reasons(0x1FF) == ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                              "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown", "display_clock_setting"]
    assert reasons(None) is None and reasons(-1) is None


def test_a_malformed_gpu_section_costs_the_gpus_not_the_snapshot() -> None:
    raw = json.loads(answer(json.dumps({"processes": False}), Memory()))
    raw["gpus"] = [{"index": "zero"}]
    snap = model.snapshot(raw, 0.0)
    assert snap.gpus.gpus == () and "Gpu.index" in (snap.gpus.error or "")
    assert snap.disks  # the rest of the reply stands


# ---------------------------------------------------------------- fuzz: anything a source returns

ODD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
    st.text(max_size=600), st.just("\x1b[31mred\x00\u202e"), st.just({"nvml_error": "NOT_SUPPORTED"}),
    st.just({"nvml_error": 7}), st.lists(st.integers(min_value=-(2**65), max_value=2**65), max_size=3),
    st.lists(st.lists(st.one_of(st.integers(min_value=-(2**65), max_value=2**65), st.none(), st.text()),
                      max_size=3), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
KEYS = ("name", "uuid", "bus_id", "utilization", "memory", "temperature", "power_usage", "power_limit",
        "clocks_event_reasons", "ecc_errors", "compute_processes", "graphics_processes", "handle")


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["tesla_t4", "rtx_3080", "dual_a5000", "a100_sxm4_mig"]),
       changes=st.lists(st.tuples(st.sampled_from(KEYS), ODD), max_size=8),
       top=st.dictionaries(st.sampled_from(["driver_version", "device_count", "init"]), ODD, max_size=2))
def test_fuzzed_readings_never_crash_and_stay_bounded(base: str, changes: list, top: dict) -> None:
    rec = copy.deepcopy(RECORDINGS[base])
    rec.update(top)
    for n, (key, value) in enumerate(changes):
        rec["devices"][n % len(rec["devices"])][key] = value
    snap = in_process(rec)
    reading = snap.gpus
    assert reading.error is None or not reading.error.startswith("malformed")  # the probe sent its shape
    assert len(reading.gpus) <= 64
    for gpu in reading.gpus:
        for text in (gpu.name, gpu.uuid, gpu.bus_id, gpu.error):
            assert text is None or len(text) <= MAX_TEXT
        for number in (gpu.util_gpu, gpu.util_memory):
            assert number is None or 0 <= number <= 100
        for number in (gpu.memory_used, gpu.memory_total, gpu.ecc_corrected, gpu.ecc_uncorrected):
            assert number is None or 0 <= number < nvml.VALUE_NOT_AVAILABLE
        assert all(p.used_memory is None or p.used_memory < nvml.VALUE_NOT_AVAILABLE for p in gpu.processes)
    assert len(reading.driver or "") <= MAX_TEXT


RECORDINGS = {name: recording(name) for name in ("tesla_t4", "rtx_3080", "dual_a5000", "a100_sxm4_mig")}


# ---------------------------------------------------------------- the ctypes layer, against a stand-in library

FAKE = Path(__file__).parent / "nvml_fake.c"


def build_fake(folder: Path, *defines: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        unavailable_here("no C compiler to build the stand-in NVML library")
    folder.mkdir()
    out = folder / nvml.LIBRARY
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", *defines, "-o", str(out), str(FAKE)], check=True)
    return out


def expected_gpus(used_mib: tuple[int, int]) -> tuple[model.Gpu, ...]:
    return (
        model.Gpu(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-aaaaaaaa-bbbb", bus_id="00000000:01:00.0",
                  util_gpu=3, util_memory=1, memory_used=used_mib[0] * MIB, memory_total=24564 * MIB, temperature=38,
                  power_draw=21.5, power_limit=450.0, throttle_reasons=("gpu_idle",), ecc_corrected=None,
                  ecc_uncorrected=None, processes=()),
        model.Gpu(index=1, name="NVIDIA H100 80GB HBM3", uuid="GPU-11111111-2222-3333-4444-555555555555",
                  bus_id="00000000:18:00.0", util_gpu=97, util_memory=41, memory_used=used_mib[1] * MIB,
                  memory_total=81559 * MIB, temperature=71, power_draw=612.34, power_limit=700.0,
                  throttle_reasons=("sw_power_cap", "sw_thermal_slowdown"), ecc_corrected=5, ecc_uncorrected=1,
                  processes=(model.GpuProcess(pid=4100, used_memory=69000 * MIB, kind="C+G"),
                             model.GpuProcess(pid=4101, used_memory=None, kind="C"))),
        model.Gpu(index=2, error="GPU is lost"),
    )


FAKE_EVENTS = [(0, "xid", 13), (1, "xid", 79), (1, "ecc_dbe", 0)]


@pytest.mark.parametrize(("defines", "used_mib"), [((), (301, 69501)), (("-DOLD_DRIVER",), (801, 70001))],
                         ids=["current API", "old driver: v1 calls only"])
def test_the_ctypes_layer_reads_through_the_c_abi(tmp_path: Path, defines: tuple, used_mib: tuple) -> None:
    library = build_fake(tmp_path / "lib", *defines)
    memory = Memory()
    memory.gpus = GpuSession(nvml.Nvml(str(library)))
    raw = json.loads(answer(json.dumps({"processes": False, "states": False}), memory))
    reading = model.snapshot(raw, 0.0).gpus
    assert (reading.error, reading.driver) == (None, "550.54.15")
    assert reading.gpus == expected_gpus(used_mib)
    # GPU 0 takes Xid events only (its ECC event is not delivered), GPU 1 all three; GPU 2 is lost.
    assert [(e.gpu, e.kind, e.code) for e in reading.events] == FAKE_EVENTS
    assert reading.events_note == "no NVML events from GPU 2 (GPU is lost)"
    again = model.snapshot(json.loads(answer(json.dumps({"processes": False, "states": False}), memory)), 0.0)
    assert again.gpus.events == reading.events  # kept for the next poll, not delivered twice
    memory.gpus.close()


async def test_the_probe_loads_the_library_by_its_name(box: Box, monkeypatch, tmp_path: Path) -> None:
    library = build_fake(tmp_path / "lib")
    monkeypatch.delenv(REPLAY_ENV, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(library.parent))  # where the probe's dlopen finds it
    snap = await box.snapshot()
    assert snap.gpus.gpus == expected_gpus((301, 69501)) and snap.gpus.driver == "550.54.15"
    assert [(e.gpu, e.kind, e.code) for e in snap.gpus.events] == FAKE_EVENTS
    assert [(e.gpu, e.kind, e.code) for e in (await box.snapshot()).gpus.events] == FAKE_EVENTS


# ---------------------------------------------------------------- events: Xid and ECC errors


def with_events(name: str, events: list[Any], **device: Any) -> dict[str, Any]:
    """A recording whose event waits deliver `events`, `device` set on its first GPU."""
    rec = recording(name)
    rec["events"] = events
    rec["devices"][0].update(device)
    return rec


def xids(snap: model.Snapshot) -> list[tuple[int, str, int]]:
    return [(e.gpu, e.kind, e.code) for e in snap.gpus.events]


async def test_an_xid_is_in_every_poll_of_every_console_after_it(box: Box, monkeypatch, tmp_path, workspace) -> None:
    replay(monkeypatch, tmp_path, with_events("dual_a5000", [[1, nvml.EVENT_XID, 79]]))
    other = Box(LocalTransport(), str(workspace), python=sys.executable)  # a second console: its own probe
    try:
        first, second = await box.snapshot(), await box.snapshot()
        elsewhere = [await other.snapshot(), await other.snapshot()]
    finally:
        await other.close()
    for snap in (first, second, *elsewhere):
        assert xids(snap) == [(1, "xid", 79)] and snap.gpus.events_note is None
        assert [g.name for g in snap.gpus.gpus] == ["NVIDIA RTX A5000"] * 2
    assert second.gpus.events == first.gpus.events  # the same event, with the time it was taken
    assert first.time - 5 < first.gpus.events[0].time <= second.time


def test_a_probe_run_once_watches_no_events(monkeypatch, tmp_path) -> None:
    replay(monkeypatch, tmp_path, with_events("a10g", [[0, nvml.EVENT_XID, 79]]))
    raw = json.loads(answer(json.dumps({"processes": False, "states": False})))  # no memory: run once
    assert (raw["gpu_events"], raw["gpu_events_note"]) == ([], None)
    assert model.snapshot(raw, 0.0).gpus.gpus[0].name == "NVIDIA A10G"


def test_a_gpu_without_ecc_events_still_reports_its_xids() -> None:
    """The three types together are NOT_SUPPORTED on a GPU without ECC: each is tried on its own."""
    rec = with_events("rtx_3080", [[0, nvml.EVENT_SINGLE_BIT_ECC, 0], [0, nvml.EVENT_XID, 31]],
                      event_types=nvml.EVENT_XID)
    snap = in_process(rec)
    assert xids(snap) == [(0, "xid", 31)] and snap.gpus.events_note is None


@pytest.mark.parametrize(("change", "note"), [
    ({"event_set": {"nvml_error": "NO_PERMISSION"}}, "NVML events: Insufficient Permissions"),
    ({"event_types": {"nvml_error": "NOT_SUPPORTED"}}, "no NVML events from GPU 0 (Not Supported)"),
    ({"event_types": 0}, "no NVML events from GPU 0 (Not Supported)"),
    ({"event_types": {"nvml_error": "GPU_IS_LOST"}}, "no NVML events from GPU 0 (GPU is lost)"),
], ids=["no event set", "register not supported", "no event type", "register fails"])
def test_an_event_api_that_fails_is_a_note_and_the_reading_stands(change: dict, note: str) -> None:
    rec = with_events("tesla_t4", [[0, nvml.EVENT_XID, 48]])
    rec.update({k: v for k, v in change.items() if k == "event_set"})
    rec["devices"][0].update({k: v for k, v in change.items() if k != "event_set"})
    snap = in_process(rec)
    assert (snap.gpus.events, snap.gpus.events_note) == ((), note)
    assert snap.gpus.gpus == in_process(recording("tesla_t4")).gpus.gpus and snap.gpus.error is None


def test_a_wait_that_fails_is_a_note_and_the_next_read_goes_on() -> None:
    rec = with_events("tesla_t4", [{"nvml_error": "UNKNOWN", "text": "bad wait"}, [0, nvml.EVENT_XID, 94]])
    memory = Memory()
    memory.gpus = GpuSession(ReplayNvml(rec))
    failed = in_process(rec, memory)
    assert (failed.gpus.events, failed.gpus.events_note) == ((), "NVML event wait: bad wait")
    assert failed.gpus.gpus[0].name == "Tesla T4"
    after = in_process(rec, memory)
    assert xids(after) == [(0, "xid", 94)] and after.gpus.events_note is None
    memory.gpus.close()
    assert memory.gpus.source.open_sets == 0  # the event set is freed with the session


GARBAGE_EVENTS = [
    ["x"], [0], None, {"a": 1}, "79", [0, nvml.EVENT_XID, -1], [0, nvml.EVENT_XID, 2**64], [0, nvml.EVENT_XID, True],
    [0, nvml.EVENT_XID, 79.0], [0.0, nvml.EVENT_XID, 79], [True, nvml.EVENT_XID, 79], [7, nvml.EVENT_XID, 79],
    [-1, nvml.EVENT_XID, 79], [0, 0x4, 0], [0, "8", 79], [0, nvml.EVENT_XID | 0x1, 79], [0, nvml.EVENT_XID, "13"],
    [0, nvml.EVENT_XID, 13],
]


def test_garbage_from_the_event_api_is_left_out() -> None:
    snap = in_process(with_events("tesla_t4", GARBAGE_EVENTS))
    assert xids(snap) == [(0, "xid", 13)] and snap.gpus.gpus[0].name == "Tesla T4"


def test_a_storm_of_events_is_bounded_per_read_and_in_what_is_kept() -> None:
    rec = with_events("tesla_t4", [[0, nvml.EVENT_XID, n] for n in range(100)])
    memory = Memory()
    memory.gpus = GpuSession(ReplayNvml(rec))
    first = in_process(rec, memory)
    assert [e.code for e in first.gpus.events] == list(range(gpu_events.MAX_DRAIN - gpu_events.KEEP,
                                                             gpu_events.MAX_DRAIN))
    assert [e.code for e in in_process(rec, memory).gpus.events] == list(range(100 - gpu_events.KEEP, 100))


def test_a_storm_of_one_kind_never_pushes_out_an_xid() -> None:
    """Single-bit ECC events by the hundred after an Xid: the Xid is still in every reply."""
    storm = [[0, nvml.EVENT_XID, 79]] + [[0, nvml.EVENT_SINGLE_BIT_ECC, 0] for _ in range(200)]
    rec = with_events("tesla_t4", storm)
    memory = Memory()
    memory.gpus = GpuSession(ReplayNvml(rec))
    for _ in range(4):  # MAX_DRAIN a read: the storm takes several polls to drain
        events = in_process(rec, memory).gpus.events
    assert [(e.kind, e.code) for e in events if e.kind == "xid"] == [("xid", 79)]
    assert len([e for e in events if e.kind == "ecc_sbe"]) == gpu_events.KEEP


EVENT_FIELD = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                        st.floats(allow_nan=True), st.text(max_size=20), st.sampled_from(["xid", "ecc_sbe", "ecc_dbe"]),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers()))
EVENT = st.one_of(EVENT_FIELD, st.dictionaries(st.sampled_from(["gpu", "kind", "code", "time", "other"]), EVENT_FIELD),
                  st.fixed_dictionaries({"gpu": st.integers(-3, 70), "kind": st.sampled_from(["xid", "ecc_dbe", "x"]),
                                         "code": st.integers(-3, 2**64 + 3), "time": st.floats(allow_nan=True)}))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None)
@given(events=st.one_of(EVENT_FIELD, st.lists(EVENT, max_size=80)), note=EVENT_FIELD)
def test_fuzzed_gpu_events_are_parsed_or_left_out_never_a_crash(events: Any, note: Any) -> None:
    raw = json.loads(answer(json.dumps({"processes": False, "states": False}), Memory()))
    raw.update({"gpus": [{"index": 0, "name": "x"}], "gpu_error": None, "gpu_events": events, "gpu_events_note": note})
    reading = model.snapshot(raw, 0.0).gpus
    assert [g.name for g in reading.gpus] == ["x"]  # bad events cost nothing else
    assert len(reading.events) <= model.MAX_GPU_EVENTS
    for event in reading.events:
        assert type(event.gpu) is int and event.gpu >= 0 and event.kind in model.GPU_EVENT_KINDS
        assert type(event.code) is int and 0 <= event.code < 2**64 and 0 <= event.time < model.MAX_EVENT_TIME
    assert reading.events_note is None or (type(reading.events_note) is str and len(reading.events_note) <= 300)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.one_of(ODD, st.tuples(st.integers(-2, 3), st.integers(-1, 20), ODD).map(list)), max_size=20),
       event_set=st.one_of(st.none(), ODD), event_types=st.one_of(st.none(), ODD))
def test_fuzzed_event_sources_never_crash(events: list, event_set: Any, event_types: Any) -> None:
    rec = copy.deepcopy(RECORDINGS["dual_a5000"])
    rec["events"] = events
    if event_set is not None:
        rec["event_set"] = event_set
    if event_types is not None:
        rec["devices"][1]["event_types"] = event_types
    reading = in_process(rec).gpus
    assert [g.name for g in reading.gpus] == ["NVIDIA RTX A5000"] * 2 and reading.error is None
    assert all(e.gpu in (0, 1) and e.kind in model.GPU_EVENT_KINDS for e in reading.events)


async def test_a_run_that_died_while_its_gpu_reported_an_xid_is_gpu_xid(box: Box, monkeypatch, tmp_path,
                                                                          workspace) -> None:
    """Issue 31: a real stage dies of an exception; the probe (the real NVML layer, on a replayed
    driver whose event wait delivers Xid 79 on GPU 1) saw the Xid while it ran: the cause is
    gpu_xid, with the run's own words kept as evidence."""
    from samai.console.core.death import cause_of_death
    from tests.helpers import wait_for

    script = "import time\ntime.sleep(1.5)\nraise RuntimeError('CUDA error: an illegal memory access')\n"
    (workspace / "job.py").write_text(script)
    assert (await box.fire("job", f"{sys.executable} job.py", "logs/job.log", verify_s=0.2)).ok
    replay(monkeypatch, tmp_path, with_events("dual_a5000", [[1, nvml.EVENT_XID, 79]]))  # the probe starts now
    assert xids(await box.snapshot()) == [(1, "xid", 79)]
    wait_for(lambda: (workspace / ".samai" / "state" / "job.rc").exists(), timeout=30)
    snap = await box.snapshot()
    found = cause_of_death(snap.state("job"), snap)
    assert found is not None and found.cause == "gpu_xid", found
    assert found.detail.startswith("GPU 1 reported Xid 79 at ") and found.detail.endswith(", while it ran")
    assert found.evidence[0].startswith("exception: RuntimeError: CUDA error: an illegal memory access")
