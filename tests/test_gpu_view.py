"""GPUs on the screen and as alerts (issue 21, items 2-4): the findings, the GPU pane, the
processes' GPU column, the utilization line and `doctor --json`, from NVML readings replayed at
the NVML boundary (remote/box/nvml_replay.py) through the box's own reader (remote/box/gpus.py)
and the model's parser. A finding that reads only the snapshot gets processes built as the box
lists them (tests/factories.py); real processes of this machine hold the GPUs where the box's own
reads or the kill are what is tested."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from textual.app import App, ComposeResult

from samai.console import replay
from samai.console.app import SamaiApp
from samai.console.core import config as config_mod
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.gpus.feed import GpusFeed
from samai.console.core.gpus.findings import STALL_S, XID_RECENT_S, GpuWatch, gpu_findings, holders_text
from samai.console.core.state import ConsoleState
from samai.console.core.update import ProcessRow
from samai.console.gpu_report import describe_gpus
from samai.remote import model
from samai.remote.box.gpus import GpuSession
from samai.remote.box.nvml_replay import ReplayNvml
from samai.remote.model import GpuReading, Process, Snapshot
from samai.widgets.curves import GpuUtilLine, util_cells
from samai.widgets.gpus import GpuPane, gpu_lines
from samai.widgets.processes import ProcessPane
from tests import factories
from tests.helpers import run_cli, start_time_of, wait_for

NVML = Path(__file__).parent / "data" / "nvml"
A5000_PID = 100477  # the training process of the two A5000s' recording, on both GPUs (21.9 + 16.8 GiB)
T4_PIDS = (5762, 675)  # the Tesla T4's: python (compute, 1005 MiB), Xorg (graphics, 22 MiB)
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(120)"
HOSTILE = "[b]A100[/b] \x1b]0;pwned\x07 [@click=app.quit]x[/]"
# The GPUs' holders where the finding reads only the snapshot: processes as the box would list them.
HOLDER = factories.process(4242, argv=(sys.executable, "-c", SLEEPER))
XORG = factories.process(675, argv=("/usr/lib/xorg/Xorg", "-core", ":0"))


def recorded(recording_name: str, pids: dict[int, int] | None = None, **device: object) -> dict:
    """A recording of tests/data/nvml (converted from a published `nvidia-smi -q -x`), its pids
    replaced by `pids` (old -> new: processes of this machine), `device` set on every GPU."""
    recording = json.loads((NVML / f"{recording_name}.json").read_text())
    pids = pids or {}
    for gpu in recording["devices"]:
        for kind in ("compute_processes", "graphics_processes"):
            gpu[kind] = [[pids.get(pid, pid), used] for pid, used in gpu[kind]]
        gpu.update(copy.deepcopy(device))
    return recording


def reading(recording: dict) -> GpuReading:
    """The recording read the way the probe reads NVML, parsed the way the console parses a reply."""
    session = GpuSession(ReplayNvml(recording))
    try:
        return model.gpu_reading(session.read())
    finally:
        session.close()


def _config(tmp_path: Path, workspace: Path) -> config_mod.Config:
    f = tmp_path / "gpu.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n'
                 '[stages.train]\nkey = "t"\ncommand = "sleep 30"\nlog = "logs/train.log"\n'
                 'markers = [{ name = "CUDA_OOM", pattern = "CUDA out of memory|torch\\\\.OutOfMemoryError", '
                 'severity = "error" }]\n')
    return config_mod.load(f)


@pytest.fixture
def sleeper(spawn):
    """A real process on this machine, alone in its session (its own process group)."""
    proc = spawn(sys.executable, "-c", SLEEPER, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def _training(snap: Snapshot, proc: Process, fired_at: float = 1000.0) -> Snapshot:
    """The snapshot with a running train stage whose chain is `proc`'s process group."""
    rec = factories.running(proc, "train", cmd="sleep 30", fired_at=fired_at)
    return replace(snap, states=(rec,))


# ---------------------------------------------------------------- the findings, one reading each

RECORDINGS = ("a100_sxm4_mig", "a10g", "dual_a5000", "rtx_3080", "tesla_t4")


def _all_pids(name: str, pid: int) -> dict[int, int]:
    gpus = json.loads((NVML / f"{name}.json").read_text())["devices"]
    return {old: pid for gpu in gpus for kind in ("compute_processes", "graphics_processes")
            for old, _ in gpu[kind]}


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_healthy_reading_has_no_finding(name) -> None:
    """Each published reading as it is (idle boxes, no errors), its holders a running stage's."""
    snap = factories.snapshot(processes=[HOLDER])
    healthy = _training(replace(snap, gpus=reading(recorded(name, _all_pids(name, HOLDER.pid)))), HOLDER)
    assert healthy.gpus.gpus and not healthy.gpus.error
    assert gpu_findings(healthy) == []


def test_no_gpu_is_no_finding() -> None:
    snap = factories.snapshot()
    assert gpu_findings(replace(snap, gpus=reading({"init": {"nvml_error": "LIBRARY_NOT_FOUND"}}))) == []


async def test_a_leftover_holder_is_named_and_killed_through_the_action_layer(box, sleeper, tmp_path,
                                                                             workspace) -> None:
    snap = await box.snapshot()
    # the two A5000s' training process, now a real process of this machine that no stage started
    snap = replace(snap, gpus=reading(recorded("dual_a5000", {A5000_PID: sleeper.pid})))
    [found] = gpu_findings(snap)
    assert found.code == "gpu_leftover" and f"pid {sleeper.pid} holds 41.6 GB" in found.message  # both GPUs
    assert "-c import time" in found.message  # its command
    assert (found.action.kind, found.action.pid) == ("kill", sleeper.pid)
    assert found.action.start_time == pytest.approx(start_time_of(sleeper.pid), abs=0.02)

    async def confirm(plan):
        return Decision.confirmed(plan, "test")

    actions = Actions(box, _config(tmp_path, workspace), AuditLog(tmp_path / "audit.jsonl"), readonly=False,
                      confirm=confirm)
    # The pid with another start time (a pid reused since) is not the process the finding named.
    refused = await actions.kill(found.action.pid, found.action.start_time + 5, grace=1)
    assert not refused.ok and sleeper.poll() is None
    outcome = await actions.kill(found.action.pid, found.action.start_time, grace=2)
    assert outcome.ok, outcome.message
    assert sleeper.wait(10) is not None


def test_a_small_holder_and_a_stage_s_own_holder_are_not_leftovers() -> None:
    snap = factories.snapshot(processes=[HOLDER, XORG])
    # the T4's python is the train stage's process; its Xorg holds 22 MiB
    t4 = reading(recorded("tesla_t4", {T4_PIDS[0]: HOLDER.pid}))
    assert gpu_findings(_training(replace(snap, gpus=t4), HOLDER)) == []
    [found] = gpu_findings(replace(snap, gpus=t4))  # no stage runs: the python is a leftover, Xorg is not
    assert found.code == "gpu_leftover" and f"pid {HOLDER.pid} holds 1.1 GB" in found.message


def test_a_leftover_whose_memory_moves_stays_one_alert(tmp_path, workspace) -> None:
    state = ConsoleState(_config(tmp_path, workspace))
    snap = factories.snapshot(processes=[HOLDER])
    for at, used in enumerate((23519559680, 23519559680 + 3 * 2**30, 23519559680 - 2**30)):
        gpus = reading(recorded("dual_a5000", {A5000_PID: HOLDER.pid}, compute_processes=[[HOLDER.pid, used]]))
        state.apply(replace(snap, time=snap.time + at, gpus=gpus), [], snap.time + at)
    [alert] = [a for a in state.alerts if a.code == "gpu_leftover"]
    assert alert.active and "holds 47.0 GB" in alert.text  # both GPUs as first seen
    assert alert.action.pid == HOLDER.pid


def test_memory_held_by_a_pid_that_is_gone_is_a_zombie_context() -> None:
    snap = factories.snapshot(processes=[XORG])  # the T4's python (pid 5762) is not on the box
    [found] = gpu_findings(replace(snap, gpus=reading(recorded("tesla_t4"))))
    assert found.code == "gpu_zombie" and f"pid {T4_PIDS[0]} holds 1.1 GB" in found.message and found.action is None
    assert "parent" in found.message and "GPU reset" in found.message  # what clears it


def test_ecc_thermal_power_and_an_unreadable_gpu() -> None:
    snap = factories.snapshot()
    none = {"compute_processes": [], "graphics_processes": []}
    cases = {
        "gpu_ecc": recorded("tesla_t4", ecc_errors=[3, 2], **none),
        "gpu_thermal": recorded("a10g", clocks_event_reasons=0x1 | 0x40, **none),
        "gpu_power": recorded("rtx_3080", clocks_event_reasons=0x80, **none),
    }
    for code, recording in cases.items():
        [found] = gpu_findings(replace(snap, gpus=reading(recording)))
        assert found.code == code and found.message.startswith(f"GPU 0 ({recording['devices'][0]['name']})")
    assert "2 uncorrectable" in gpu_findings(replace(snap, gpus=reading(cases["gpu_ecc"])))[0].message
    # A GPU at its power cap, idle or at the clocks it was set to is working as it should.
    assert gpu_findings(replace(snap, gpus=reading(recorded("a10g", clocks_event_reasons=0x7, **none)))) == []
    lost = recorded("dual_a5000", **none)
    lost["devices"][1]["handle"] = {"nvml_error": "GPU_IS_LOST"}
    [found] = gpu_findings(replace(snap, gpus=reading(lost)))
    assert (found.code, found.severity) == ("gpu_unreadable", "error") and found.message.startswith("GPU 1 ")


def with_events(recording_name: str, *events: tuple[int, int, int]) -> dict:
    """A recording, its processes left out, whose probe drains these NVML events: (gpu, type, data)."""
    recording = recorded(recording_name, compute_processes=[], graphics_processes=[])
    recording["events"] = [list(event) for event in events]
    return recording


XID, SBE, DBE = 0x8, 0x1, 0x2  # nvmlEventType* (nvml.h)


def test_a_recent_xid_is_an_alert_saying_what_it_means_and_what_to_do() -> None:
    snap = factories.snapshot()
    gpus = reading(with_events("dual_a5000", (1, XID, 79), (0, XID, 13), (0, XID, 13), (1, XID, 555), (0, DBE, 0)))
    at = gpus.events[0].time
    clock = time.strftime("%H:%M:%S UTC", time.gmtime(at))
    found = {f.message.split(" reported ")[1][:7]: f for f in gpu_findings(replace(snap, time=at + 60, gpus=gpus))}
    assert {f.code for f in found.values()} == {"gpu_xid"} and set(found) == {"Xid 79 ", "Xid 13 ", "Xid 555"}
    lost = found["Xid 79 "]
    assert lost.severity == "error" and lost.message.startswith(
        f"GPU 1 (NVIDIA RTX A5000) reported Xid 79 (GPU has fallen off the bus) at {clock}: ")
    assert "drain the box" in lost.message and "reset the GPU or reboot" in lost.message
    app = found["Xid 13 "]  # twice: one alert
    assert app.severity == "warning" and app.message.startswith("GPU 0 (NVIDIA RTX A5000) reported Xid 13 (graphics")
    assert "restart it" in app.message
    unknown = found["Xid 555"]
    assert unknown.severity == "warning" and "one this console does not describe" in unknown.message
    # a double-bit ECC event is no Xid alert: the uncorrectable count's alert says it (gpu_ecc)
    assert gpu_findings(replace(snap, gpus=reading(with_events("tesla_t4", (0, DBE, 0))))) == []


def test_an_xid_needing_a_reset_is_an_error_and_the_application_s_a_warning() -> None:
    snap = factories.snapshot()
    codes = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)
    gpus = reading(with_events("a10g", *[(0, XID, code) for code in codes]))
    found = gpu_findings(replace(snap, time=gpus.events[-1].time, gpus=gpus))
    severity = {int(f.message.split("Xid ")[1].split(" ")[0]): f.severity for f in found}
    assert {code for code, level in severity.items() if level == "error"} == {48, 64, 74, 79, 95, 119, 120}
    assert {code for code, level in severity.items() if level == "warning"} == {13, 31, 43, 45, 63, 92, 94}


def test_an_xid_alert_stays_one_alert_while_recent_then_resolves(tmp_path, workspace) -> None:
    state = ConsoleState(_config(tmp_path, workspace))
    base = factories.snapshot()
    gpus = reading(with_events("tesla_t4", (0, XID, 95)))  # the probe sends it in every reply from now on
    t0 = gpus.events[0].time

    def poll(at: float):
        state.apply(replace(base, time=t0 + at, gpus=gpus), [], t0 + at)
        return [a for a in state.active_alerts() if a.code == "gpu_xid"]

    [alert] = poll(1)
    assert alert.severity == "error" and "Xid 95 (uncontained ECC error)" in alert.text
    assert poll(600) == [alert] and poll(XID_RECENT_S) == [alert]
    assert poll(XID_RECENT_S + 1) == []
    assert [a.resolved_at for a in state.alerts if a.code == "gpu_xid"] == [t0 + XID_RECENT_S + 1]


# ---------------------------------------------------------------- what only a sequence shows


def test_a_training_stage_on_idle_gpus_is_a_stall_alert_until_they_work_again(tmp_path, workspace) -> None:
    state = ConsoleState(_config(tmp_path, workspace))
    base = _training(factories.snapshot(processes=[HOLDER]), HOLDER)
    t0 = base.time

    def poll(at: float, util: int):
        # the two A5000s' training run, as the train stage's process, at `util` % on both GPUs
        gpus = reading(recorded("dual_a5000", {A5000_PID: HOLDER.pid}, utilization=[util, 10]))
        snap = replace(base, time=t0 + at, gpus=gpus)
        state.apply(snap, [], t0 + at)
        return [a for a in state.active_alerts() if a.code == "gpu_stall"]

    assert poll(0, 95) == [] and poll(5, 93) == []  # the run has used its GPU: the short limit applies
    assert poll(10, 0) == [] and poll(10 + STALL_S / 2, 1) == []  # a dip, not yet a stall
    [alert] = poll(10 + STALL_S, 0)
    assert alert.severity == "error" and "stage train" in alert.text and "~0 %" in alert.text
    assert poll(20 + STALL_S, 0) == [alert]  # one alert while it lasts
    assert poll(30 + STALL_S, 88) == []  # working again: resolved
    assert [a.resolved_at for a in state.alerts if a.code == "gpu_stall"] == [t0 + 30 + STALL_S]
    # the utilization line's series, oldest first, with the dip in it
    assert state.feed(GpusFeed).watch.utilization() == [95, 93, 0, 1, 0, 0, 88]


def test_a_run_that_never_used_its_gpu_gets_the_longer_startup_limit(tmp_path, workspace) -> None:
    watch = GpuWatch(_config(tmp_path, workspace), stall_s=60, startup_stall_s=300)
    base = _training(factories.snapshot(processes=[HOLDER]), HOLDER)
    idle = reading(recorded("dual_a5000", {A5000_PID: HOLDER.pid}))  # as recorded: 0 % on both
    assert [f for f in watch.findings(replace(base, time=base.time, gpus=idle)) if f.code == "gpu_stall"] == []
    assert [f for f in watch.findings(replace(base, time=base.time + 120, gpus=idle)) if f.code == "gpu_stall"] == []
    assert [f.code for f in watch.findings(replace(base, time=base.time + 300, gpus=idle))] == ["gpu_stall"]
    # A CPU-only run (no GPU memory held) is never a GPU stall.
    cpu_only = GpuWatch(_config(tmp_path, workspace), stall_s=60, startup_stall_s=60)
    for at in (0, 100, 200):
        no_holder = recorded("dual_a5000", compute_processes=[])
        assert cpu_only.findings(replace(base, time=base.time + at, gpus=reading(no_holder))) == []


async def test_a_cuda_oom_in_the_train_log_is_an_alert_with_the_largest_holders(box, sleeper, tmp_path,
                                                                              workspace) -> None:
    state = ConsoleState(_config(tmp_path, workspace))
    (workspace / "logs").mkdir()
    (workspace / "logs" / "train.log").write_text(
        "step 3\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 1.2 GiB is free.\n")
    followers = state.followers()
    snap = await box.snapshot(**state.request(followers))
    # the RTX 3080's five graphics processes, the largest (835) now the sleeper
    snap = replace(snap, gpus=reading(recorded("rtx_3080", {835: sleeper.pid})))
    update = state.apply(snap, followers, time.time())
    [alert] = [a for a in update.new_alerts if "OutOfMemoryError" in a.text]
    assert alert.severity == "error" and alert.stage == "train"
    holders = alert.text.split("largest GPU holders now: ")[1]
    assert holders.startswith(f"GPU 0: pid {sleeper.pid} ") and "576.7 MB" in holders
    # the three largest, largest first (550, 541 and 159 MiB); not the 79 and 18 MiB ones
    assert holders.index(f"pid {sleeper.pid} ") < holders.index("pid 4044 ") < holders.index("pid 42416 ")
    assert "pid 2214 " not in holders and "pid 1481 " not in holders


# ---------------------------------------------------------------- the screen


def _rows(snap: Snapshot) -> list[ProcessRow]:
    return [ProcessRow(p, None, 0.0, ()) for p in snap.processes]


class _Panes(App):
    def compose(self) -> ComposeResult:
        yield GpuPane()
        yield ProcessPane()


async def test_the_gpu_pane_and_column_show_a_reading_and_hostile_names_literally() -> None:
    hostile = factories.process(4300, argv=(sys.executable, "-c", SLEEPER, HOSTILE))
    recording = recorded("rtx_3080", {835: hostile.pid}, name=HOSTILE, clocks_event_reasons=0x40)
    recording["devices"] += recorded("a100_sxm4_mig")["devices"]  # MIG: utilization not supported
    snap = factories.snapshot(processes=[hostile], gpus=reading(recording))

    rtx, mig = gpu_lines(snap.gpus).plain.split("\n")
    assert "1.1/10G" in rtx and "  0%" in rtx and "31°C" in rtx and "23/336W" in rtx
    assert rtx.startswith(" 0 [b]A100[/b] ␛]0…")  # as sent, cut to fit, ESC shown
    assert rtx.endswith(" hot") and "\x1b" not in rtx + mig
    assert mig.startswith(" 1 A100-SXM4-80GB") and "   ?%" in mig and "0.0/80G" in mig  # MIG: no utilization
    assert "27°C" in mig and "67/500W" in mig
    # a narrow pane keeps every number and drops the names first
    narrow = gpu_lines(snap.gpus, 50).plain.split("\n")
    assert narrow[1].startswith(" 1 ") and "A100" not in narrow[1] and narrow[1].endswith("27°C 67/500W")
    assert all(len(line) <= 50 for line in narrow[1:])
    assert gpu_lines(reading({"init": {"nvml_error": "LIBRARY_NOT_FOUND"}})).plain.startswith("no GPU: NVML")

    app = _Panes()
    async with app.run_test(size=(120, 30)) as pilot:
        app.query_one(GpuPane).show(snap.gpus)
        pane = app.query_one(ProcessPane)
        pane.show(_rows(snap), snap.time, snap.gpus)
        await pilot.pause()
        assert pane.table.labels == ("stage", "pid", "user", "cpu%", "rss", "gpu", "age", "ports", "command")
        cells = dict(pane.table.rows)[f"{hostile.pid}:{snap.process(hostile.pid).start_time}"]
        assert cells[5] == "577M" and "[b]A100[/b] ␛]0;pwned␇ [@click=app.quit]x[/]" in cells[-1]
        assert "other 577M GPU" in str(pane.border_subtitle)
        pane.show(_rows(snap), snap.time, GpuReading(error="no NVIDIA GPU found"))  # no GPU: no column
        assert "gpu" not in pane.table.labels


async def test_the_console_shows_the_gpus_the_column_the_line_and_the_alerts() -> None:
    """The recorded box (tests/data/recorded_box.json) through the real app, with the two A5000s'
    reading: their training process is the recorded train stage's python."""
    recording = replay.load(Path(__file__).parent / "data" / "recorded_box.json")
    now = recording["probe"]["time"]
    app = SamaiApp(replay.recorded_config(recording), poll=False, clock=lambda: now)
    async with app.run_test(size=(160, 48)) as pilot:
        assert not app.box_screen.query_one(GpuPane).display  # nothing read yet: no pane
        gpus = reading(recorded("dual_a5000", {A5000_PID: 4250}, utilization=[91, 40]))
        for at in (0, 2):
            followers = app.state.followers()
            snap = replace(replay.recorded_snapshot(recording, followers), time=now + at, gpus=gpus)
            app.show_snapshot(snap, followers)
        await pilot.pause()
        pane = app.box_screen.query_one(GpuPane)
        assert pane.display and "RTX A5000" in pane.render().plain and "91%" in pane.render().plain
        table = app.box_screen.query_one(ProcessPane).table
        assert "gpu" in table.labels
        row = next(cells for key, cells in table.rows if key.startswith("4250:"))
        assert row[0] == "train" and row[table.labels.index("gpu")] == "42G"
        assert "train 42G GPU" in str(app.box_screen.query_one(ProcessPane).border_subtitle)
        line = app.box_screen.query_one(GpuUtilLine)
        assert line.display and line.series == [91, 91]
        assert not [a for a in app.state.alerts if a.code.startswith("gpu_")]  # the train stage's own


def test_the_utilization_line_shows_a_stalled_step_as_a_dip() -> None:
    assert util_cells([95.0, 97.0, 0.0, 0.0, 96.0, None], 10) == "██  █?"
    assert util_cells([50.0] * 30, 4) == "▄▄▄▄" and util_cells([50.0], 0) == ""


# ---------------------------------------------------------------- doctor


@pytest.mark.slow
def test_doctor_and_snapshot_carry_the_gpus_and_their_findings(tmp_path, workspace, sleeper) -> None:
    recording = recorded("tesla_t4", {T4_PIDS[0]: sleeper.pid, T4_PIDS[1]: os.getpid()}, ecc_errors=[0, 1])
    (tmp_path / "nvml.json").write_text(json.dumps(recording))
    cfg = tmp_path / "doctor.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n'
                   '[stages.train]\nkey = "t"\ncommand = "sleep 30"\ncheckpoints = "ckpt"\n')
    replayed = {"SAMAI_NVML_REPLAY": str(tmp_path / "nvml.json")}
    r = run_cli("--config", str(cfg), "doctor", "--json", env=replayed)
    out = json.loads(r.stdout)
    assert r.returncode == 1  # an uncorrectable ECC error is an error
    [gpu] = out["gpus"]["gpus"]
    assert gpu["name"] == "Tesla T4" and gpu["processes"][0]["pid"] == sleeper.pid
    codes = {f["code"]: f for f in out["findings"]}
    assert set(codes) == {"gpu_leftover", "gpu_ecc"}
    assert codes["gpu_leftover"]["action"].startswith(f"kill {sleeper.pid} ")
    text = run_cli("--config", str(cfg), "doctor", env=replayed).stdout
    assert "[0] Tesla T4  util 0%" in text and f"pid {sleeper.pid:>7} C" in text
    wait_for(lambda: sleeper.poll() is None)  # doctor looks, never touches
    snap = json.loads(run_cli("--config", str(cfg), "snapshot", "--json", env=replayed).stdout)
    assert snap["gpus"] == out["gpus"]
    assert {f["code"] for f in snap["gpu_findings"]} == {"gpu_leftover", "gpu_ecc"}
    assert "[0] Tesla T4  util 0%" in run_cli("--config", str(cfg), "snapshot", env=replayed).stdout


# ---------------------------------------------------------------- garbage in


INT = st.one_of(st.none(), st.integers(-2**63, 2**64))
FLOAT = st.one_of(st.none(), st.floats(), st.integers(-10**6, 10**12))
TEXT = st.one_of(st.none(), st.text(max_size=60))
GPU = st.fixed_dictionaries({"index": st.integers(-5, 2**31)}, optional={
    "name": TEXT, "uuid": TEXT, "error": TEXT, "util_gpu": INT, "util_memory": INT, "memory_used": INT,
    "memory_total": INT, "temperature": INT, "power_draw": FLOAT, "power_limit": FLOAT, "ecc_uncorrected": INT,
    "throttle_reasons": st.one_of(st.none(), st.lists(st.text(max_size=30), max_size=4)),
    "processes": st.lists(st.fixed_dictionaries({"pid": st.integers(0, 2**31)}, optional={
        "used_memory": INT, "kind": st.text(max_size=5)}), max_size=4)})


EVENTS = st.lists(st.fixed_dictionaries({"gpu": st.integers(0, 2**31), "kind": st.sampled_from(["xid", "ecc_sbe"]),
                                          "code": st.integers(0, 2**64 - 1), "time": st.floats(0, 1e11)}), max_size=4)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(GPU, max_size=3), TEXT, st.sampled_from([None, "a GPU field of the wrong type"]), EVENTS)
def test_any_gpu_reading_renders_and_is_checked_without_a_crash(gpus, error, wrong, events) -> None:
    """Whatever values a GPU section holds (nan, negative, huge, control characters), the pane,
    the report and the findings cope; a section of the wrong shape is dropped with its error."""
    if wrong:
        gpus = [*gpus, {"index": 0, "util_gpu": "97"}]
    parsed = model.gpu_reading({"gpus": gpus, "gpu_error": error, "gpu_events": events})
    assert len(parsed.gpus) == (0 if wrong else len(gpus)) and (parsed.error is not None if wrong else True)
    me = factories.process(os.getpid(), ppid=1, pgid=1, sid=1, user="me", start_time=1.0, cpu_time=0.0, rss=0,
                           argv=("python", "[b]x[/b]"))
    snap = factories.snapshot(time=1.0, host="", boot_time=0, rtt=0.0, disks=(), processes=(me,), gpus=parsed)
    text = gpu_lines(parsed).plain + describe_gpus(parsed, snap) + holders_text(parsed, snap)
    assert "\x1b" not in text
    gpu_findings(snap)
    GpuWatch(config_mod.load_builtin("tiny")).findings(snap)
