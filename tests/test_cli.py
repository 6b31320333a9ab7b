"""The command-line contract, run as a user runs it: separate processes, real exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from tests.helpers import run_cli, start_time_of, wait_for

PIPELINE = """
pipeline = "cli"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello; sleep {sleep}"
[stages.broken]
key = "b"
command = "definitely-not-a-command"
[artifacts.base]
path = "models/base"
[stages.needy]
key = "e"
command = "echo I had what I needed"
needs = ["base"]
"""


@pytest.fixture
def cfg_file(tmp_path: Path, workspace: Path) -> Path:
    f = tmp_path / "samai.toml"
    f.write_text(PIPELINE.format(ws=workspace, sleep=30))
    return f


def _audit(isolated_dirs: Path) -> list[dict]:
    path = isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in lines if e["phase"] == "outcome"]  # each action's last word (its intent precedes it)


def test_version_and_help() -> None:
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("samai-console 0.")
    assert run_cli("--help").returncode == 0


def test_snapshot_json_is_this_machine(cfg_file: Path) -> None:
    r = run_cli("--config", str(cfg_file), "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    pids = {p["pid"]: p for p in snap["processes"]}
    assert os.getpid() in pids
    assert abs(pids[os.getpid()]["start_time"] - start_time_of(os.getpid())) < 0.05
    assert snap["disks"] and snap["host"]


def test_snapshot_text_lists_the_stages(cfg_file: Path) -> None:
    r = run_cli("snapshot", "--config", str(cfg_file))  # global options after the command work too
    assert r.returncode == 0 and "[h] hello" in r.stdout and "idle" in r.stdout


@pytest.mark.slow
def test_fire_and_stop_a_stage_and_both_are_audited(cfg_file: Path, workspace: Path, isolated_dirs) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "hello", "--yes")
    assert r.returncode == 0, r.stderr
    assert "verified running" in r.stdout
    state = json.loads((workspace / ".samai" / "state" / "hello.json").read_text())
    assert psutil.Process(state["pid"]).is_running()
    r = run_cli("--config", str(cfg_file), "stop", "hello", "--yes", "--grace", "2")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not psutil.pid_exists(state["pid"]) or
             psutil.Process(state["pid"]).status() == psutil.STATUS_ZOMBIE)
    fire, stop = _audit(isolated_dirs)
    assert (fire["action"], fire["result"], fire["confirmation"]) == ("fire", "done", "--yes")
    assert fire["command"] == "echo hello; sleep 30" and fire["pid"] == state["pid"]
    assert fire["start_time"] == state["start_time"] and fire["target"] == "local"
    assert (stop["action"], stop["result"]) == ("stop", "done") and "SIGTERM" in stop["command"]


@pytest.mark.slow
def test_a_failing_stage_exits_1_with_its_log_tail(cfg_file: Path) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "broken", "--yes")
    assert r.returncode == 1
    assert "rc=127" in r.stderr and "definitely-not-a-command" in r.stderr


@pytest.mark.slow
def test_a_blocked_preflight_needs_force(cfg_file: Path, workspace: Path, isolated_dirs) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "needy", "--yes")
    assert r.returncode == 1 and "needs base (models/base): missing" in r.stderr and "--force" in r.stderr
    assert not (workspace / ".samai" / "state" / "needy.json").exists()
    r = run_cli("--config", str(cfg_file), "fire", "needy", "--force", "--yes")  # an override, and confirmed
    assert r.returncode == 0, r.stderr
    assert [(e["confirmation"], e["result"]) for e in _audit(isolated_dirs)] == [("declined", "cancelled"),
                                                                               ("override", "done")]


def test_unknown_stage_is_a_usage_error(cfg_file: Path, isolated_dirs) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "nope", "--yes")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unknown stage 'nope'" in r.stderr and "hello, broken, needy" in r.stderr
    assert _audit(isolated_dirs) == []


@pytest.mark.slow
def test_usage_mistakes_are_one_line_exit_2() -> None:
    for argv in (["kill", "123"], ["kill", "abc", "--start-time", "1"], ["frobnicate"],
                 ["--target", "gopher://x", "snapshot"], ["tail", "x", "--grep", "("]):
        r = run_cli(*argv)
        assert r.returncode == 2, argv
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, argv


@pytest.mark.slow
def test_kill_with_a_wrong_start_time_is_refused(spawn, isolated_dirs) -> None:
    proc = spawn("sleep", "30")
    real = start_time_of(proc.pid)
    r = run_cli("kill", str(proc.pid), "--start-time", f"{real - 3:.2f}", "--signal", "KILL", "--yes")
    assert r.returncode == 1 and "another process" in r.stderr
    assert proc.poll() is None
    (entry,) = _audit(isolated_dirs)
    assert entry["result"] == "refused" and entry["pid"] == proc.pid
    r = run_cli("kill", str(proc.pid), "--start-time", f"{real:.2f}", "--yes")
    assert r.returncode == 0, r.stderr
    assert proc.wait(5) != 0


@pytest.mark.slow
def test_actions_need_confirmation(cfg_file: Path, workspace: Path, isolated_dirs) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "hello")  # stdin is not a terminal, no --yes
    assert r.returncode == 1 and "--yes" in r.stderr
    assert not (workspace / ".samai" / "state" / "hello.json").exists()
    (entry,) = _audit(isolated_dirs)
    assert (entry["confirmation"], entry["result"]) == ("declined", "cancelled")


@pytest.mark.slow
def test_readonly_refuses_every_action(cfg_file: Path, workspace: Path, spawn) -> None:
    proc = spawn("sleep", "30")
    start = start_time_of(proc.pid)
    for argv in (["fire", "hello"], ["stop", "hello"], ["kill", str(proc.pid), "--start-time", str(start)]):
        r = run_cli("--config", str(cfg_file), "--readonly", *argv, "--yes")
        assert r.returncode == 1 and "read-only" in r.stderr
    assert proc.poll() is None
    assert not (workspace / ".samai" / "state" / "hello.json").exists()


def test_an_action_is_refused_when_the_audit_log_cannot_be_written(cfg_file: Path, workspace: Path,
                                                                   tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    r = run_cli("--config", str(cfg_file), "fire", "hello", "--yes", env={"XDG_STATE_HOME": str(blocker)})
    assert r.returncode == 1 and "audit log" in r.stderr and "refused" in r.stderr
    assert not (workspace / ".samai" / "state" / "hello.json").exists()


@pytest.mark.slow
def test_secrets_never_reach_the_audit_log(tmp_path: Path, workspace: Path, isolated_dirs) -> None:
    f = tmp_path / "s.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n[stages.push]\nkey = "p"\n'
                 'command = "echo uploading --token=hf_abcdefghijklmnopqrstuvwxyz123456"\n')
    assert run_cli("--config", str(f), "fire", "push", "--yes").returncode == 0
    text = (isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl").read_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in text and "--token=***" in text


@pytest.mark.slow
def test_tail_prints_last_lines_and_filters(workspace: Path, cfg_file: Path) -> None:
    log = workspace / "logs" / "t.log"
    log.parent.mkdir()
    log.write_text("".join(f"{i} {'even' if i % 2 == 0 else 'odd'}\n" for i in range(100)))
    r = run_cli("--config", str(cfg_file), "tail", "logs/t.log", "-n", "4")
    assert r.returncode == 0 and r.stdout.splitlines() == ["96 even", "97 odd", "98 even", "99 odd"]
    r = run_cli("--config", str(cfg_file), "tail", str(log), "-n", "6", "--grep", "!even")
    assert r.stdout.splitlines() == ["95 odd", "97 odd", "99 odd"]
    r = run_cli("--config", str(cfg_file), "tail", "logs/absent.log")
    assert r.returncode == 1 and "No such file" in r.stderr


@pytest.mark.slow
def test_tail_follow_prints_appended_lines(workspace: Path, cfg_file: Path) -> None:
    import subprocess
    import sys

    log = workspace / "f.log"
    log.write_text("old\n")
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "--config", str(cfg_file), "tail", str(log),
                             "-n", "1", "--follow"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "old\n"
        with open(log, "a") as f:
            f.write("new 1\nnew 2\n")
        assert proc.stdout.readline() == "new 1\n" and proc.stdout.readline() == "new 2\n"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_tail_follow_survives_the_probe_dying_and_resumes_at_its_byte_offset(workspace: Path, cfg_file: Path) -> None:
    """An outage during `tail --follow` (its probe killed, as a dropped SSH connection ends it):
    it says so on stderr, reconnects, and goes on from the same byte: numbered lines, none twice,
    none missing."""
    import signal
    import subprocess
    import sys
    import threading

    import psutil

    log = workspace / "n.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 51)))
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "--config", str(cfg_file), "tail", str(log),
                             "-n", "50", "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    try:
        seen = [proc.stdout.readline() for _ in range(50)]
        probes = [p for p in psutil.Process(proc.pid).children(recursive=True) if "probe" in " ".join(p.cmdline())]
        assert probes, "the follow runs through a held probe"
        for p in probes:
            p.send_signal(signal.SIGKILL)
        with open(log, "a") as f:  # written while the probe is gone
            f.write("".join(f"line {i}\n" for i in range(51, 151)))
        seen += [proc.stdout.readline() for _ in range(100)]
        assert [line.strip() for line in seen] == [f"line {i}" for i in range(1, 151)]
        assert wait_for(lambda: any("reconnected" in e for e in stderr), 10)
        assert any("not answering" in e for e in stderr)
        with open(log, "a") as f:
            f.write("line 151\n")
        assert proc.stdout.readline() == "line 151\n" and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
