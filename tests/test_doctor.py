"""The detectors against real processes, files and sockets: `doctor` and the TUI's alerts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from samai.console.core.detectors import reasoning_format
from tests.helpers import run_cli, wait_for

WRITER = "import sys,time\nf=open(sys.argv[1],'a')\nf.write('x');f.flush()\nprint('ready',flush=True)\ntime.sleep(60)"


def _config(tmp_path: Path, workspace: Path, port: int, extra: str = "") -> Path:
    f = tmp_path / "doctor.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n'
                 f'[model]\nllama_server = "{workspace}/bin/llama-server"\n'
                 '[artifacts.base]\npath = "base"\n'
                 f'[stages.serve]\nkey = "v"\ncommand = "sleep 30"\nports = [{port}]\n'
                 '[stages.train]\nkey = "t"\ncommand = "sleep 30"\npoison = ["TRAIN_NAN"]\n'
                 'checkpoints = "ckpt"\n' + extra)
    return f


def _doctor(cfg: Path, *, own_box: bool = False) -> tuple[int, list[dict]]:
    """doctor --json on this machine; own_box: in a PID namespace of its own (as root), so that
    the box it reads holds only it: the other workers' stages (their llama-servers) are on this
    machine too."""
    if own_box and os.geteuid() == 0 and shutil.which("unshare"):
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "samai.console",
                            "--config", str(cfg), "doctor", "--json"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    else:
        r = run_cli("--config", str(cfg), "doctor", "--json")
    return r.returncode, json.loads(r.stdout)["findings"] if r.stdout else [{"stderr": r.stderr}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_quiet_box_has_nothing_but_the_missing_binary(tmp_path, workspace) -> None:
    rc, findings = _doctor(_config(tmp_path, workspace, _free_port()), own_box=True)
    assert [f["code"] for f in findings] == ["binary_missing"] and rc == 1
    (workspace / "bin").mkdir()
    (workspace / "bin" / "llama-server").write_text("#!/bin/sh\n")
    rc, findings = _doctor(_config(tmp_path, workspace, _free_port()), own_box=True)
    assert "not executable" in findings[0]["message"]
    (workspace / "bin" / "llama-server").chmod(0o755)
    assert _doctor(_config(tmp_path, workspace, _free_port()), own_box=True) == (0, [])


def test_two_independent_writers_on_one_file(tmp_path, workspace, spawn) -> None:
    target = workspace / "model.gguf.part"
    procs = [spawn(sys.executable, "-c", WRITER, str(target), stdout=subprocess.PIPE, text=True,
                   start_new_session=True) for _ in range(2)]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    _, findings = _doctor(_config(tmp_path, workspace, _free_port()))
    shared = [f for f in findings if f["code"] == "shared_writer"]
    assert len(shared) == 1 and str(target) in shared[0]["message"]
    assert shared[0]["action"].startswith(f"kill {procs[1].pid} ")  # the newer one


def test_a_shell_and_its_child_sharing_an_output_is_not_flagged(tmp_path, workspace, spawn) -> None:
    log = workspace / "chain.log"
    with open(log, "a") as out:
        shell = spawn("sh", "-c", "sleep 30 & sleep 30; wait", stdout=out, start_new_session=True)
    # Both children started, each writing the log: what a shared_writer finding would be about.
    wait_for(lambda: len(_writing(shell.pid, log)) == 3)
    _, findings = _doctor(_config(tmp_path, workspace, _free_port()))
    assert not [f for f in findings if f["code"] == "shared_writer"]


def test_a_stale_server_and_a_split_reasoning_server(tmp_path, workspace, spawn) -> None:
    port = _free_port()
    fake = workspace / "bin" / "llama-server"
    fake.parent.mkdir()
    code = f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\ntime.sleep(60)"
    fake.write_text(f"#!{sys.executable}\n{code}\n")
    fake.chmod(0o755)
    server = spawn(str(fake), "-m", "old.gguf")
    wait_for(lambda: _listening(port))
    rc, findings = _doctor(_config(tmp_path, workspace, port))
    codes = {f["code"]: f for f in findings}
    assert "stale_server" in codes and str(server.pid) in codes["stale_server"]["message"]
    assert "reasoning_split" in codes and codes["reasoning_split"]["action"].startswith(f"kill {server.pid} ")


@pytest.mark.slow
def test_poison_files_and_a_lost_stage(tmp_path, workspace) -> None:
    (workspace / "TRAIN_NAN").write_text("")
    cfg = _config(tmp_path, workspace, _free_port())
    assert run_cli("--config", str(cfg), "fire", "train", "--yes").returncode == 0
    state = json.loads((workspace / ".samai" / "state" / "train.json").read_text())
    _, findings = _doctor(cfg)
    assert "poison_files" not in {f["code"] for f in findings}  # it runs: not a restart yet
    os.killpg(state["pgid"], signal.SIGKILL)  # the OOM killer's way: no CHAIN_DONE
    wait_for(lambda: "stage_lost" in {f["code"] for f in _doctor(cfg)[1]})
    codes = {f["code"]: f for f in _doctor(cfg)[1]}
    assert codes["stage_lost"]["action"] == "restart train"
    assert codes["poison_files"]["action"] == "restart train" and "TRAIN_NAN" in codes["poison_files"]["message"]


def _writing(pid: int, path: Path) -> list[int]:
    """pid and its children that hold path open."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children()]
    return [p.pid for p in procs if any(f.path == str(path) for f in p.open_files())]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False




@pytest.mark.slow
def test_two_listeners_on_a_serve_port(tmp_path, workspace, spawn) -> None:
    port = _free_port()
    code = ("import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
            f"s.bind(('127.0.0.1',{port}))\ns.listen()\nprint('ready',flush=True)\ntime.sleep(60)")
    servers = [spawn(sys.executable, "-c", code, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for s in servers:
        assert s.stdout.readline() == "ready\n"
    rc, findings = _doctor(_config(tmp_path, workspace, port))
    contended = [f for f in findings if f["code"] == "port_contended"]
    assert rc == 1 and len(contended) == 1 and "2 listeners" in contended[0]["message"]
    assert {str(s.pid) for s in servers} <= set(contended[0]["message"].replace(",", " ").replace(")", " ").split())
@pytest.mark.slow
def test_a_server_the_stage_started_in_a_session_of_its_own_is_not_stale(tmp_path, workspace) -> None:
    port = _free_port()
    listen = workspace / "listen.py"
    listen.write_text(f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\n"
                      "time.sleep(60)\n")
    cfg = _config(tmp_path, workspace, port).read_text().replace(
        'command = "sleep 30"\nports', f'command = "setsid {sys.executable} {listen} & sleep 30"\nports', 1)
    (tmp_path / "doctor.toml").write_text(cfg)
    assert run_cli("--config", str(tmp_path / "doctor.toml"), "fire", "serve", "--yes").returncode == 0
    wait_for(lambda: _listening(port))
    _, findings = _doctor(tmp_path / "doctor.toml")
    assert "stale_server" not in {f["code"] for f in findings}, findings


@pytest.mark.slow
def test_findings_quote_no_secret_from_a_command_line(tmp_path, workspace, spawn) -> None:
    port = _free_port()
    listen = workspace / "l.py"  # short, so that the secret is inside what a finding quotes
    listen.write_text(f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\n"
                      "time.sleep(60)\n")
    secret = "hf_" + "Q7" * 15
    spawn(sys.executable, listen.name, "--token", secret, cwd=workspace)
    wait_for(lambda: _listening(port))
    for argv in (("doctor", "--json"), ("doctor",)):
        r = run_cli("--config", str(_config(tmp_path, workspace, port)), *argv)
        assert "stale_server" in r.stdout and secret not in r.stdout + r.stderr


def test_doctor_checks_the_newest_eval_runs_items_as_the_tui_does(tmp_path, workspace) -> None:
    """The eval findings the TUI raises (issue 30): the newest run's items through `check eval`,
    and a summary that cannot be read, from a real snapshot of the workspace."""
    item = {"prompt": "17*23=", "gold": "391", "pred": None, "correct": False, "finish_reason": "length",
            "content": "", "reasoning_content": "<think>17*20 = 340"}
    for name, summary, at in (("bad", '{"n": 1e400}', 1e9), ("split", '{"n": 8, "accuracy": 0.0}', 2e9)):
        (workspace / "runs" / "eval" / name).mkdir(parents=True)
        (workspace / "runs" / "eval" / name / "summary.json").write_text(summary)
        os.utime(workspace / "runs" / "eval" / name / "summary.json", (at, at))  # split is the newer run
    (workspace / "runs" / "eval" / "split" / "items.jsonl").write_text(
        "".join(json.dumps(dict(item, id=i)) + "\n" for i in range(8)))
    rc, findings = _doctor(_config(tmp_path, workspace, _free_port()))
    codes = {f["code"]: f for f in findings}
    assert rc == 1 and {"fake_zero", "truncation", "empty_content", "unreadable_summary"} <= set(codes)
    assert codes["fake_zero"]["message"].startswith("eval split: accuracy 0 % is likely fake")
    assert "runs/eval/bad/summary.json cannot be read" in codes["unreadable_summary"]["message"]


@pytest.mark.parametrize(("argv", "value"), [
    (["llama-server", "-m", "m.gguf"], None),
    (["llama-server", "--reasoning-format", "none"], "none"),
    (["llama-server", "--reasoning-format=none"], "none"),
    (["llama-server", "--reasoning-format", "deepseek"], "deepseek"),
    (["llama-server", "--reasoning-format", "none", "--reasoning-format", "auto"], "auto"),  # the last one wins
    (["llama-server", "--reasoning-format"], ""),
])
def test_the_reasoning_format_is_read_from_the_command_line(argv: list[str], value: str | None) -> None:
    assert reasoning_format(argv) == value
