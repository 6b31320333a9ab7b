"""The command line's stderr contract holds whatever the libraries print: a failed command says
one line (`samai-console: ...`), and a warning any dependency raises (at import or later) goes to
the warnings log, never to stderr.

A library's new release is stood in for by an import hook that warns as each of the console's
dependencies is imported (tests/data/noisy_imports/sitecustomize.py); PYTHONWARNINGS=always also
shows every warning the installed releases raise, DeprecationWarnings included, as a user's
environment may."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

NOISY = Path(__file__).parent / "data" / "noisy_imports"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once it is closed


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "PYTHONWARNINGS": "always",
           "PYTHONPATH": os.pathsep.join([str(NOISY), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("SAMAI_NOTIFY_URLS", None)
    return subprocess.run([sys.executable, "-m", "samai.console", *args], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=90)


def failing_commands(tmp_path: Path) -> dict[str, list[str]]:
    port = closed_port()
    return {
        "ssh target that refuses": ["--target", f"ssh://nobody@127.0.0.1:{port}", "snapshot"],
        "malformed ssh URL": ["--target", "ssh://user@host:99999", "snapshot"],
        "gateway that refuses": ["--target", f"envelope+http://127.0.0.1:{port}", "snapshot"],
        "missing config": ["--config", str(tmp_path / "nope.toml"), "snapshot"],
        "unknown box": ["--box", "nope", "snapshot"],
        "watch with a URL apprise cannot use": ["watch", "--once", "--notify", "nosuchscheme://x"],
    }


@pytest.mark.slow
def test_a_failed_command_says_one_line_while_every_library_warns(tmp_path: Path) -> None:
    for name, args in failing_commands(tmp_path).items():
        home = tmp_path / name.replace(" ", "-")
        home.mkdir()
        r = cli(home, *args)
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("samai-console: "), (name, r.stderr)
        assert "Warning" not in r.stdout, (name, r.stdout)


@pytest.mark.slow
def test_the_warnings_go_to_the_warnings_log(tmp_path: Path) -> None:
    r = cli(tmp_path, "--target", f"ssh://nobody@127.0.0.1:{closed_port()}", "snapshot")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    kept = (tmp_path / "state" / "samai" / "warnings.log").read_text()
    assert "asyncssh 99.0 deprecates this" in kept  # the stand-in release's warning, kept, not lost
