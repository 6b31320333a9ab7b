"""`snapshot --json` and `doctor --json` read a running server's monitoring endpoints: a real HTTP
server as the serve stage (Python's, which has /health-like answers for nothing: it shows what it
can and says why the rest is missing), then the same server stopped with SIGSTOP (serve_hung)."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.helpers import run_cli, wait_for
from tests.receivers import free_port

pytestmark = pytest.mark.slow  # a real server fired as a stage, then the CLI, several times


def _config(tmp_path: Path, workspace: Path, port: int) -> Path:
    f = tmp_path / "serving.toml"
    command = f"{sys.executable} -m http.server {port} --bind 127.0.0.1"
    f.write_text(f'[workspace]\npath = "{workspace}"\n'
                 f'[stages.serve]\nkey = "v"\ncommand = {json.dumps(command)}\nports = [{port}]\n')
    return f


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
            return True
    except OSError:
        return False


def test_a_running_server_is_read_then_a_stopped_one_is_serve_hung(tmp_path: Path, workspace: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, workspace, port)
    assert run_cli("--config", str(cfg), "fire", "serve", "--yes").returncode == 0
    wait_for(lambda: _answers(port), timeout=30)
    r = run_cli("--config", str(cfg), "snapshot", "--json")
    [view] = json.loads(r.stdout)["serving"]
    assert (view["port"], view["stage"], view["health"], view["health_ok"]) == (port, "serve", "HTTP 404", False)
    assert "no /metrics (HTTP 404)" in view["metrics_note"] and view["engine"] is None

    server = next(p for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or ())
                  and "http.server" in " ".join(p.info["cmdline"] or ()))
    os.kill(server.pid, signal.SIGSTOP)
    try:
        r = run_cli("--config", str(cfg), "doctor", "--json")
        found = json.loads(r.stdout)["findings"]
        [hung] = [f for f in found if f["code"] == "serve_hung"]
        assert f":{port}" in hung["message"] and hung["action"].startswith("restart"), hung
        [view] = json.loads(run_cli("--config", str(cfg), "snapshot", "--json").stdout)["serving"]
        assert view["health"].startswith("no answer within") and view["health_seconds"] is None
    finally:
        os.kill(server.pid, signal.SIGCONT)
        run_cli("--config", str(cfg), "stop", "serve", "--yes")
