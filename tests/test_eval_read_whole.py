"""No silent cut in the eval path (issue 46, item 7): `eval diff` and the check of a run's items
read every line of each file, a read at a time, or refuse to judge and say why. Two runs of
120,000 items whose regression is all in the second half were said to be "within noise" when
only each file's first 4 MiB was read.

The files are real, on a local workspace, read through the Box as a user's command reads them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.evals import runs as evalruns
from samai.console.core.evals.diff import MAX_ITEMS, RunReader, TooManyItems, diff, read_run
from samai.console.core.evals.runs import EvalRun, NotReadWhole, check_items, item_batches, read_run_items
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import run_cli

N = 120_000
WORSE_FROM, WORSE_EVERY = N // 2, 20  # B gets every 20th item of the second half wrong: 3,000 items


def line(i: int, right: bool, pad: str = "") -> str:
    return json.dumps({"id": f"q{i}", "gold": "4", "pred": "4" if right else "5", "correct": right,
                       "finish_reason": "stop", "content": f"the answer is {'4' if right else '5'}{pad}",
                       "reasoning_content": ""}) + "\n"


def write_runs(workspace: Path) -> tuple[Path, Path]:
    folders = []
    for name in ("before", "after"):
        folder = workspace / "runs" / "eval" / name
        folder.mkdir(parents=True)
        worse = name == "after"
        with open(folder / "items.jsonl", "w") as f:
            f.writelines(line(i, not (worse and i >= WORSE_FROM and i % WORSE_EVERY == 0)) for i in range(N))
        folders.append(folder)
    return folders[0], folders[1]


def test_a_regression_in_the_second_half_of_120000_items_is_found_by_the_command(
        workspace: Path, tmp_path: Path) -> None:
    before, after = write_runs(workspace)
    assert (after / "items.jsonl").stat().st_size > 3 * evalruns.ITEMS_READ  # many reads, not one
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    r = run_cli("--config", str(cfg), "eval", "diff", "before", "after", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["paired"] == N and got["noise"] is False
    assert len(got["right_to_wrong"]) == (N - WORSE_FROM) // WORSE_EVERY and got["wrong_to_right"] == []
    assert got["right_to_wrong"][0] == f"q{WORSE_FROM}" and got["right_to_wrong"][-1] == f"q{N - WORSE_EVERY}"
    assert got["interval"][1] < 0 and got["accuracy_a"] == 1.0


async def test_the_check_of_a_runs_items_reads_them_all(box: Box, workspace: Path) -> None:
    """The TUI's and doctor's check of a finished run: a fake zero in the second half is counted."""
    folder = workspace / "runs" / "eval" / "late"
    folder.mkdir(parents=True)
    with open(folder / "items.jsonl", "w") as f:
        for i in range(N):
            empty = i >= WORSE_FROM
            f.write(json.dumps({"id": i, "gold": "4", "pred": None if empty else "4", "correct": not empty,
                                "finish_reason": "stop", "content": "" if empty else "4",
                                "reasoning_content": "so the answer is 4" if empty else ""}) + "\n")
    result = await check_items(box, EvalRun("late", N, 0.5, 0, 0, folder=str(folder)))
    assert result is not None and result.n == N and result.empty_content == N - WORSE_FROM
    assert "fake_zero" in {p.code for p in result.problems} or "empty_content" in {p.code for p in result.problems}
    assert await check_items(box, EvalRun("none", 0, None, 0, 0, folder=str(workspace / "nowhere"))) is None


async def test_a_file_replaced_while_it_is_read_is_refused(box: Box, workspace: Path) -> None:
    path = workspace / "items.jsonl"
    path.write_text("".join(line(i, True) for i in range(5000)))
    batches = item_batches(box, str(path), max_bytes=64 * 1024)
    first = await anext(batches)
    assert first and first[0].startswith('{"id": "q0"')
    replaced = workspace / "items.new"
    replaced.write_text("".join(line(i, False) for i in range(5000)))
    os.replace(replaced, path)  # another eval run wrote its items over it
    with pytest.raises(NotReadWhole, match="replaced or truncated while it was read"):
        async for _ in batches:
            pass
    with open(path, "r+") as f:  # truncated in place, then rewritten shorter
        batches = item_batches(box, str(path), max_bytes=64 * 1024)
        await anext(batches)
        f.truncate(0)
        f.write(line(1, True) * 10)
    with pytest.raises(NotReadWhole, match="replaced or truncated"):
        async for _ in batches:
            pass


async def test_a_file_that_grows_while_it_is_read_is_read_to_its_end(box: Box, workspace: Path) -> None:
    """An eval still writing its items: what is there when the read ends is read, every line whole."""
    path = workspace / "items.jsonl"
    path.write_text("".join(line(i, True) for i in range(3000)))
    batches = item_batches(box, str(path), max_bytes=64 * 1024)
    lines = list(await anext(batches))
    with open(path, "a") as f:
        f.writelines(line(i, True) for i in range(3000, 4000))
    async for batch in batches:
        lines += batch
    assert [json.loads(x)["id"] for x in lines] == [f"q{i}" for i in range(4000)]


def test_a_fifo_or_a_folder_as_items_is_refused_with_why(workspace: Path, tmp_path: Path) -> None:
    for name in ("before", "after"):
        (workspace / "runs" / "eval" / name).mkdir(parents=True)
    (workspace / "runs" / "eval" / "before" / "items.jsonl").write_text(line(1, True))
    os.mkfifo(workspace / "runs" / "eval" / "after" / "items.jsonl")  # a reader would wait on it forever
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    r = run_cli("--config", str(cfg), "eval", "diff", "before", "after", "--json", timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert "eval run 'after': " in r.stderr and "cannot be read whole" in r.stderr and "\n" not in r.stderr.strip()


async def test_more_items_than_a_diff_keeps_are_refused_not_judged_on_a_part(box: Box, workspace: Path) -> None:
    path = workspace / "items.jsonl"
    path.write_text("".join(line(i, True) for i in range(1001)))
    with pytest.raises(NotReadWhole, match="holds more than 1,000 items, more than a diff keeps: not compared"):
        await read_run_items(box, "a", str(path), max_items=1000)
    assert len((await read_run_items(box, "a", str(path), max_items=1001)).items) == 1001
    with pytest.raises(TooManyItems):
        read_run("a", [line(i, True) for i in range(11)], max_items=10)
    assert MAX_ITEMS > 2 * N


def test_two_long_ids_that_share_their_start_stay_two_items() -> None:
    start = "x" * 300
    a = read_run("a", [json.dumps({"id": start + "1", "gold": "1", "pred": "1"}),
                       json.dumps({"id": start + "2", "gold": "1", "pred": "1"})])
    b = read_run("b", [json.dumps({"id": start + "1", "gold": "1", "pred": "1"}),
                       json.dumps({"id": start + "2", "gold": "1", "pred": "0"})])
    assert len(a.items) == 2 and a.duplicates == 0
    d = diff(a, b)
    assert d.paired == 2 and len(d.right_to_wrong) == 1 and d.right_to_wrong[0].id.startswith("x" * 200 + "…#")


async def test_a_line_longer_than_a_read_is_one_item(box: Box, workspace: Path) -> None:
    """A reasoning model's answer of megabytes is one line across several reads: one item, whole."""
    path = workspace / "items.jsonl"
    path.write_text(line(1, True) + line(2, True, pad=" and so" * 300_000) + line(3, False))
    got = await read_run_items(box, "a", str(path))
    assert got is not None and sorted(got.items) == ["q1", "q2", "q3"] and got.unreadable == 0



PIECES = st.lists(st.one_of(
    st.builds(lambda i, right: line(i, right).rstrip("\n"), st.integers(0, 30), st.booleans()),
    st.builds(lambda i, n: line(i, True, pad="é" * n).rstrip("\n"), st.integers(0, 30), st.integers(100, 3000)),
    st.text(max_size=40), st.just("")), max_size=30)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(PIECES, st.sampled_from(["\n", "\r\n"]), st.booleans(), st.integers(1, 5))
def test_a_run_read_a_read_at_a_time_is_the_run_read_whole(tmp_path_factory, pieces: list[str], end: str,
                                                            last_end: bool, kib: int) -> None:
    """Whatever the lines (long ones across reads, multibyte characters cut by a read, CRLF, no
    final line break), the items read a few KiB at a time through the Box are those of the whole file."""
    ws = tmp_path_factory.mktemp("ws")
    text = end.join(pieces) + (end if last_end and pieces else "")
    (ws / "items.jsonl").write_bytes(text.encode("utf-8", "surrogatepass"))

    async def streamed():
        box = Box(LocalTransport(), str(ws), python=sys.executable)
        try:
            reader = RunReader("a")
            async for batch in item_batches(box, str(ws / "items.jsonl"), max_bytes=kib * 1024):
                reader.feed(batch)
            return reader.result()
        finally:
            await box.close()

    whole = read_run("a", [p.removesuffix("\r") for p in text.encode("utf-8", "surrogatepass")
                           .decode("utf-8", "replace").split("\n")])
    assert asyncio.run(streamed()) == whole


def test_check_eval_counts_an_item_of_megabytes_as_one_item(workspace: Path, tmp_path: Path) -> None:
    """`check eval` read each line up to 64 KiB: a reasoning model's long item was "malformed"."""
    (workspace / "items.jsonl").write_text(line(1, True) + line(2, True, pad=" and so" * 300_000) + line(3, False))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    r = run_cli("--config", str(cfg), "check", "eval", "items.jsonl", "--json", timeout=120)
    got = json.loads(r.stdout)
    assert (got["n"], got["correct"], got["malformed"]) == (3, 2, 0), r.stderr
