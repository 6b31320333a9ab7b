"""The suite cleans up after itself: a test that fails or times out stops what it fired."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from samai.remote.box.procfs import boot_time, read_stat, same_start, start_epoch

CASES = Path(__file__).with_name("cases") / "left_running.py"


def _alive(pid: int, start_time: float) -> bool:
    st = read_stat(pid)
    return bool(st) and st["state"] != "Z" and same_start(start_epoch(st["starttime"], boot_time()), start_time)


def test_a_failed_or_timed_out_test_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "fired.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                         cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SAMAI_HYGIENE_OUT": str(out)})
    assert "2 failed" in run.stdout, run.stdout[-3000:]
    assert "Timeout" in run.stdout, run.stdout[-3000:]
    fired = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(fired) == 2
    left = [f["pid"] for f in fired if _alive(f["pid"], f["start_time"])]
    assert not left, f"stages still running after their tests ended: {left}"
