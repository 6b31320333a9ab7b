"""The suite cleans up after itself: a test that fails or times out stops what it fired."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from samai.remote.box.procfs import boot_time, read_stat, same_start, start_epoch
from tests.conftest import SLOW_FIXTURES

pytestmark = pytest.mark.slow  # each runs pytest, or reads every test file

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


# ---------------------------------------------------------------- the fast tier (make test-quick)

TESTS = Path(__file__).parent
# What makes a fixture slow, as its code says it: a real sshd, a box venv provisioned, the Gemma model.
SLOW_CALLS = ("SshServer(", 'stage("provision")', "run_stage(box, cfg, \"provision\"", "gemma_q4_k_m(")


def _fixtures() -> dict[str, str]:
    """Every fixture defined in tests/: name -> its source."""
    found = {}
    for path in TESTS.glob("*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    "fixture" in ast.unparse(d) for d in node.decorator_list):
                found[node.name] = ast.get_source_segment(source, node) or ""
    return found


def test_every_fixture_that_starts_sshd_or_provisions_is_a_slow_fixture() -> None:
    fixtures = _fixtures()
    slow = {name for name, source in fixtures.items() if any(call in source for call in SLOW_CALLS)}
    assert slow and slow <= SLOW_FIXTURES, f"slow fixtures not in conftest's SLOW_FIXTURES: {slow - SLOW_FIXTURES}"
    assert SLOW_FIXTURES <= fixtures.keys(), f"SLOW_FIXTURES names no fixture: {SLOW_FIXTURES - fixtures.keys()}"


def test_the_fast_tier_leaves_out_every_test_of_a_slow_fixture() -> None:
    pipeline = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.glob("test_pipeline*.py"))
    files = [*pipeline, "tests/test_ssh.py", "tests/test_multinode.py", "tests/test_state_fast.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--strict-markers", "-m", "not slow", *files],  # strict: `slow` is registered
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=120)
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert any("test_state_fast.py::" in t for t in collected), run.stdout[-2000:] + run.stderr[-2000:]
    assert any("test_multinode.py::test_the_multi_node_keys" in t for t in collected)  # no slow fixture
    assert len(pipeline) >= 4  # each module that fires the pipeline's stages
    assert not [t for t in collected if "test_pipeline" in t or "test_ssh.py::" in t or "two_ssh_boxes" in t]
