"""Two provisions sharing one cache (two workspaces of one user): the second waits for the first
and says so, so that neither builds over, nor replaces, what the other is copying from. Real
processes holding a real lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOLDER = """import sys, time
from samai.remote.box.stages.provision import cache_locked
with cache_locked():
    print("held", time.time(), flush=True)
    time.sleep(float(sys.argv[1]))
    print("releasing", time.time(), flush=True)
"""


def _holder(cache: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(seconds)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SAMAI_CACHE": str(cache)})


def test_a_second_provision_waits_for_the_cache_and_says_so(tmp_path: Path) -> None:
    first = _holder(tmp_path / "cache", 1.5)
    assert first.stdout is not None and first.stdout.readline().startswith("held")
    second = _holder(tmp_path / "cache", 0)
    out, _ = second.communicate(timeout=30)
    released = float(first.communicate(timeout=30)[0].split()[-1])
    lines = out.splitlines()
    assert lines[0].startswith("waiting for another provision that is using " + str(tmp_path / "cache"))
    assert float(lines[1].split()[1]) >= released


def test_a_provision_alone_does_not_wait(tmp_path: Path) -> None:
    out, _ = _holder(tmp_path / "fresh" / "cache", 0).communicate(timeout=30)  # the folder made on the way
    assert out.splitlines()[0].startswith("held") and (tmp_path / "fresh" / "cache" / ".lock").exists()
