"""Following a log through rotation, against a real writer and GNU `tail -F` as the reference:
logrotate's rename and create loses no line, copytruncate loses no more than tail -F, and a
FIFO, a device or a socket is refused at once instead of leaving a probe blocked in open()."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.remote import model
from samai.remote.box import logfiles
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import LogFollower
from samai.remote.safe_text import visible
from samai.widgets.logview import LogView
from tests.helpers import pilot_until, run_cli, unavailable_here, wait_for
from tests.test_fuzz_box_input import JSON

CONFIG = """
pipeline = "rotation"
[target]
python = "{python}"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello"
"""

# Appends numbered lines, thousands a second, with one write each (O_APPEND: whole lines). On
# SIGHUP it reopens LOG (creating it if the rotation did not), as logrotate's postrotate asks a
# daemon to, and says on stdout the number of the first line the new file gets. On SIGTERM it
# stops and says how many lines it wrote.
WRITER = r"""
import os, signal, sys, time
path = sys.argv[1]
flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
asked = {"reopen": False, "stop": False}
signal.signal(signal.SIGHUP, lambda *_: asked.update(reopen=True))
signal.signal(signal.SIGTERM, lambda *_: asked.update(stop=True))
fd = os.open(path, flags, 0o644)
n = 0
while not asked["stop"]:
    if asked["reopen"]:
        asked["reopen"] = False
        os.close(fd)
        fd = os.open(path, flags, 0o644)
        print(n, flush=True)
    os.write(fd, b"line %07d %s\n" % (n, b"x" * (n % 37)))
    n += 1
    if n % 40 == 0:
        time.sleep(0.01)
print(n, flush=True)
"""

LINE = re.compile(r"line (\d{7}) x*")


class Output:
    """Every line a follower process prints, collected as it comes (a thread drains the pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def numbers(self) -> list[int]:
        return [int(m.group(1)) for m in map(LINE.fullmatch, self.lines) if m]

    def has(self, n: int) -> bool:
        return any(x >= n for x in self.numbers()[-50:])

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        self.thread.join(timeout=30)
        return err


@pytest.fixture
def cfg_file(tmp_path: Path, workspace: Path) -> Path:
    f = tmp_path / "rotation.toml"
    f.write_text(CONFIG.format(ws=workspace, python=sys.executable))
    return f


@pytest.fixture
def followers(cfg_file: Path, spawn):
    """Ours (`samai-console tail --follow`, a local target) and GNU `tail -F`, both on LOG from its
    one line "ready" on: each has printed it before this returns."""
    if b"GNU coreutils" not in subprocess.run(["tail", "--version"], capture_output=True).stdout:
        unavailable_here("GNU tail is the reference")

    def start(log: Path) -> tuple[Output, Output]:
        log.write_text("ready\n")
        ours = Output(spawn(sys.executable, "-m", "samai.console", "--config", str(cfg_file), "tail", str(log),
                            "-n", "1", "--follow", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        gnu = Output(spawn("tail", "-n", "1", "-F", str(log), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True))
        wait_for(lambda: ours.lines[:1] == ["ready"] and gnu.lines[:1] == ["ready"], timeout=60)
        return ours, gnu

    return start


def _writer(spawn, tmp_path: Path, log: Path) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return spawn(sys.executable, "-S", str(script), str(log), stdout=subprocess.PIPE, text=True)


def _finish(writer: subprocess.Popen, ours: Output, gnu: Output) -> tuple[int, str, str]:
    """Stop the writer; once ours has printed its last line (and tail -F had its chance to), stop
    both: the number of lines written and each follower's stderr."""
    writer.send_signal(signal.SIGTERM)
    total = int(writer.stdout.readlines()[-1])
    writer.wait(timeout=30)
    wait_for(lambda: ours.has(total - 1), timeout=60)
    try:
        wait_for(lambda: gnu.has(total - 1), timeout=5)
    except AssertionError:
        pass  # tail -F lost the last lines: the reference is allowed to
    return total, ours.stop(), gnu.stop()


def _shift(log: Path) -> None:
    """logrotate's `rotate N`: LOG.2 -> LOG.3, LOG.1 -> LOG.2, then LOG -> LOG.1."""
    for k in range(8, 0, -1):
        older = Path(f"{log}.{k}")
        if older.exists():
            older.rename(f"{log}.{k + 1}")
    log.rename(f"{log}.1")


def _lost(numbers: list[int], total: int) -> int:
    return total - len(set(numbers))


@pytest.mark.slow
def test_rename_rotation_loses_no_line(tmp_path: Path, workspace: Path, followers, spawn) -> None:
    log = workspace / "train.log"
    ours, gnu = followers(log)
    writer = _writer(spawn, tmp_path, log)
    wait_for(lambda: ours.has(1000), timeout=60)
    ways = ("create", "writer creates", "compress", "create", "writer creates")
    for way in ways:
        _shift(log)
        if way == "create":  # logrotate's default: a new empty LOG at once, the daemon told after
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT, 0o644))
        writer.send_signal(signal.SIGHUP)
        first = int(writer.stdout.readline())  # the writer has moved to the new LOG: no more lines in LOG.1
        if way == "compress":  # no delaycompress: LOG.1 is gone before the follower's next read
            rotated = Path(f"{log}.1")
            with gzip.open(f"{rotated}.gz", "wb") as z:
                z.write(rotated.read_bytes())
            rotated.unlink()
        wait_for(lambda n=first + 500: ours.has(n), timeout=60)  # well into the new file: rotate again
    total, ours_err, gnu_err = _finish(writer, ours, gnu)

    numbers = ours.numbers()
    assert ours.lines[0] == "ready" and all(LINE.fullmatch(line) for line in ours.lines[1:]), \
        "a line of ours is not one the writer wrote (two glued together?)"
    assert numbers == list(range(total)), (
        f"ours lost {_lost(numbers, total)} and repeated {len(numbers) - len(set(numbers))} of {total} lines; "
        f"tail -F lost {_lost(gnu.numbers(), total)}")
    assert ours_err.count("rotated (now ") == len(ways)
    assert ours_err.count("reading the new one from its start") == len(ways)


@pytest.mark.slow
def test_copytruncate_loses_no_more_than_gnu_tail(tmp_path: Path, workspace: Path, followers, spawn) -> None:
    log = workspace / "serve.log"
    ours, gnu = followers(log)
    writer = _writer(spawn, tmp_path, log)
    wait_for(lambda: ours.has(3000), timeout=60)
    # logrotate's copytruncate, with the writer between two lines: whatever is written while
    # it copies would be lost to every reader, which is not what this compares.
    writer.send_signal(signal.SIGSTOP)
    wait_for(lambda: Path(f"/proc/{writer.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")
    shutil.copyfile(log, f"{log}.1")
    os.truncate(log, 0)
    writer.send_signal(signal.SIGCONT)
    on_disk = (Path(f"{log}.1").read_text() + log.read_text()).splitlines()[1:]  # both files, as written so far
    wait_for(lambda: ours.has(len(on_disk) + 3000), timeout=60)
    total, ours_err, gnu_err = _finish(writer, ours, gnu)

    numbers = ours.numbers()
    assert numbers == sorted(set(numbers)), "ours repeated or reordered lines"
    assert _lost(numbers, total) <= _lost(gnu.numbers(), total)
    assert [int(line.split()[1]) for line in on_disk] == list(range(len(on_disk)))
    assert numbers == list(range(total)), "every line still in the copy or the log reached us"
    assert "truncated in place; reading the rest from its copy" in ours_err


# ------------------------------------------------------------ several rotations between two polls


class Generations:
    """A log the test writes itself, numbered lines as the writer's, and rotates as logrotate
    does: every line's place is known, so what a follower prints can be checked line by line."""

    def __init__(self, log: Path) -> None:
        self.log, self.n = log, 0

    def write(self, count: int) -> None:
        with open(self.log, "ab") as f:
            f.write(b"".join(b"line %07d %s\n" % (n, b"x" * (n % 37)) for n in range(self.n, self.n + count)))
        self.n += count

    def numbered(self, k: int) -> Path:
        return Path(f"{self.log}.{k}")

    def shift(self) -> None:
        """LOG.8 -> LOG.9 ... LOG.1 -> LOG.2: room for a new LOG.1."""
        for k in range(8, 0, -1):
            if self.numbered(k).exists():
                self.numbered(k).rename(self.numbered(k + 1))

    def create(self) -> None:
        """logrotate's default: LOG -> LOG.1 and a new, empty LOG (the writer reopens it)."""
        self.shift()
        self.log.rename(self.numbered(1))
        self.log.touch()

    def copytruncate(self) -> None:
        """logrotate's copytruncate: LOG copied to LOG.1, then LOG truncated in place."""
        self.shift()
        shutil.copyfile(self.log, self.numbered(1))
        os.truncate(self.log, 0)


@pytest.fixture
def tail_follow(cfg_file: Path, spawn):
    """`samai-console tail LOG -n 1 --follow`, started once LOG holds its line "ready"."""

    def start(log: Path) -> Output:
        log.write_text("ready\n")
        ours = Output(spawn(sys.executable, "-m", "samai.console", "--config", str(cfg_file), "tail", str(log),
                            "-n", "1", "--follow", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        wait_for(lambda: ours.lines[:1] == ["ready"], timeout=60)
        return ours

    return start


class Paused:
    """The follower stopped (SIGSTOP) while the block runs: whatever the block does to the log
    happens between two of its polls."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def __enter__(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGCONT)


def _read_through(ours: Output, gen: Generations) -> str:
    """Once the follower printed the last line written (a last one written after the rest, so
    any earlier generation would have come before it), stop it: its stderr."""
    gen.write(1)
    wait_for(lambda: ours.has(gen.n - 1), timeout=60)
    return ours.stop()


@pytest.mark.slow
@pytest.mark.parametrize("rotations", [2, 3])
def test_several_renames_between_two_polls_read_every_generation_in_order(workspace: Path, tail_follow,
                                                                           rotations: int) -> None:
    log = workspace / "train.log"
    ours = tail_follow(log)
    gen = Generations(log)
    gen.write(100)
    wait_for(lambda: ours.has(99), timeout=60)
    with Paused(ours.proc):
        gen.write(50)  # the rest of the file being read, not read yet
        for _ in range(rotations):
            gen.create()
            gen.write(100)
    err = _read_through(ours, gen)
    assert ours.lines[0] == "ready" and ours.numbers() == list(range(gen.n)), err
    assert err.count("reading the rest of it first") == 1, err
    assert err.count("reading the generation after it") == rotations - 1, err
    assert err.count("reading the new one from its start") == 1, err
    assert "not read" not in err, err


@pytest.mark.slow
def test_copytruncates_between_two_polls_read_every_copy_in_order(workspace: Path, tail_follow) -> None:
    log = workspace / "serve.log"
    ours = tail_follow(log)
    gen = Generations(log)
    gen.write(100)
    wait_for(lambda: ours.has(99), timeout=60)
    with Paused(ours.proc):
        gen.write(50)
        for _ in range(2):
            gen.copytruncate()
            gen.write(100)
    err = _read_through(ours, gen)
    assert ours.lines[0] == "ready" and ours.numbers() == list(range(gen.n)), err
    assert "truncated in place; reading the rest from its copy" in err and "not read" not in err, err
    assert err.count("reading the generation after it") == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deleted", "compressed"])
def test_a_generation_gone_before_its_first_read_is_named_with_what_it_held(workspace: Path, tail_follow,
                                                                             how: str) -> None:
    """Two renames between two polls, and the middle generation (never seen by the follower)
    deleted or compressed away: every other line comes, in order, and one line names it."""
    log = workspace / "app.log"
    ours = tail_follow(log)
    gen = Generations(log)
    gen.write(100)
    wait_for(lambda: ours.has(99), timeout=60)
    with Paused(ours.proc):
        gen.create()
        first_lost = gen.n
        gen.write(100)
        lost_bytes = gen.log.stat().st_size
        gen.create()  # the lost lines are in LOG.1 now
        gen.write(100)
        middle = gen.numbered(1)
        if how == "compressed":
            with gzip.open(f"{middle}.gz", "wb") as z:
                z.write(middle.read_bytes())
        middle.unlink()
    err = _read_through(ours, gen)
    lost = set(range(first_lost, first_lost + 100))
    assert ours.numbers() == [n for n in range(gen.n) if n not in lost], err
    (notice,) = [line for line in err.splitlines() if "not read" in line]
    if how == "compressed":
        assert f"{middle.name}.gz (compressed, {lost_bytes} bytes of log)" in notice, notice
    else:
        assert f"{middle.name} (gone before it was read" in notice, notice


@pytest.mark.slow
def test_a_copy_gone_before_the_rest_in_it_is_read_says_from_which_byte(workspace: Path, tail_follow) -> None:
    """Two copytruncates between two polls, and the first copy (which alone holds the rest of
    what was being read) deleted: the notice names the file and the byte the loss starts at, and
    the second copy and the log itself are read whole."""
    log = workspace / "gen.log"
    ours = tail_follow(log)
    gen = Generations(log)
    gen.write(100)
    wait_for(lambda: ours.has(99), timeout=60)
    read = log.stat().st_size
    with Paused(ours.proc):
        gen.write(50)
        gen.copytruncate()
        gen.write(100)
        gen.copytruncate()
        gen.write(100)
        gen.numbered(2).unlink()
    err = _read_through(ours, gen)
    assert ours.numbers() == [*range(100), *range(150, gen.n)], err
    (notice,) = [line for line in err.splitlines() if "not read" in line]
    assert f"inode {log.stat().st_ino} from byte {read} " in notice, notice
    assert ": truncated; " in notice, notice
    assert notice.endswith(f"reading the generation after it, {gen.numbered(1)}, from its start"), notice


async def test_a_generation_gone_before_its_end_is_read_says_which_bytes(box: Box, workspace: Path) -> None:
    """A probe without a kept descriptor, behind in a file that is then rotated twice and
    deleted: the notice names its inode and the bytes it did not read; the next generation and
    the current file are read whole."""
    log = workspace / "e.log"
    gen = Generations(log)
    gen.write(100)
    follower = LogFollower(str(log), offset=0, max_bytes=1000)
    lines, _ = await _one_burst(box, follower)
    assert lines == [f"line {n:07d} {'x' * (n % 37)}" for n in range(len(lines))] and follower.offset is not None
    read, size, inode = follower.offset, log.stat().st_size, log.stat().st_ino
    gen.create()
    gen.write(10)
    gen.create()
    gen.write(10)
    gen.numbered(2).unlink()
    lines, notices = await _one_shot(box, follower)
    lines += (await _one_shot(box, follower))[0]
    assert [int(line.split()[1]) for line in lines][-20:] == list(range(100, 120))
    (notice,) = [n for n in notices if "not read" in n]
    assert f"inode {inode}, bytes {read}-{size} ({size - read} bytes)" in notice, notice


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None)
@given(older=JSON, gone=JSON, unread=JSON, drain=st.sampled_from([None, "renamed"]))
def test_a_reply_naming_any_generations_is_a_chunk_or_a_box_error(older, gone, unread, drain) -> None:
    """What the box says of a log's generations is untrusted: a chunk the follower can send back
    and say in one inert line, or a BoxError, never another exception."""
    raw = {"path": "/w/x.log", "inode": 2, "rotated": True, "drain": drain, "older": older, "gone": gone,
           "unread": unread, "old_file": "/w/x.log.1\x1b[2J"}
    try:
        chunk = model.log_chunk(raw)
    except BoxError:
        return
    follower = LogFollower("/w/x.log", offset=5, inode=1, size=9)
    notice = follower.consume(chunk).notice
    assert notice is not None and visible(notice) == notice and "\n" not in notice
    request = follower.cursor().request()
    assert request["older"] is None or all(type(i) is int and 0 <= i < 2**64 for i in request["older"])


@pytest.fixture(scope="module")
def rotated_log(tmp_path_factory) -> Path:
    """A log and one older generation beside it."""
    log = tmp_path_factory.mktemp("generations") / "f.log"
    log.write_text("one\n")
    Path(f"{log}.1").write_text("zero\n")
    return log


@settings(max_examples=200, deadline=None, database=None)
@given(older=JSON)
def test_a_request_naming_any_older_generations_is_answered(rotated_log: Path, older) -> None:
    """The follower's "older" is only a hint: whatever it holds, the read is answered."""
    (reply,) = logfiles.logs([{"path": str(rotated_log), "offset": 0, "inode": 1, "older": older}])
    assert "error" not in reply and (reply["older"] is None or all(type(i) is int for i in reply["older"]))


# ------------------------------------------------------------ the probe without a kept descriptor


async def _one_shot(box: Box, follower: LogFollower) -> tuple[list[str], list[str]]:
    """What a fresh probe per request (the envelope gateway's way) gives the follower, to the end."""
    lines, notices = [], []
    while True:
        reply = await box.call("probe.py", {"logs": [follower.cursor().request()], "processes": False,
                                            "states": False})
        update = follower.consume(model.log_chunk(reply["logs"][0]))
        lines += update.lines
        notices += [update.notice] if update.notice else []
        if not update.more:
            return lines, notices


async def _one_burst(box: Box, follower: LogFollower) -> tuple[list[str], list[str]]:
    """One read by a fresh probe: what it gives the follower, more or not."""
    reply = await box.call("probe.py", {"logs": [follower.cursor().request()], "processes": False, "states": False})
    update = follower.consume(model.log_chunk(reply["logs"][0]))
    return update.lines, [update.notice] if update.notice else []


@pytest.mark.slow
async def test_a_one_shot_probe_finds_the_rotated_log_among_its_siblings(box: Box, workspace: Path) -> None:
    log = workspace / "a.log"
    log.write_text("one\n")
    follower = LogFollower(str(log), offset=0, max_bytes=5)  # small reads: a drain takes several
    assert (await _one_shot(box, follower))[0] == ["one"]
    with open(log, "a", buffering=1) as writer:
        writer.write("two\n")
        log.rename(workspace / "a.log-20250101")  # dateext
        log.write_text("new 1\n")
        writer.write("three\nunfinished")  # the daemon has not reopened yet
        writer.flush()
    lines, notices = await _one_shot(box, follower)
    assert lines == ["two", "three"] and "rotated (now " in notices[0] and "a.log-20250101" in notices[0]
    lines, notices = await _one_shot(box, follower)  # the old file stayed at its end: switch
    assert lines == ["unfinished", "new 1"], "the old file's last line is not glued to the new file's first"
    assert "reading the new one from its start" in notices[0]


async def test_a_serve_probe_reads_a_rotated_log_deleted_before_its_next_read(box: Box, workspace: Path) -> None:
    """The file it had open is read to its end even when no name of it is left to find."""
    log = workspace / "b.log"
    log.write_text("one\n")
    follower = LogFollower(str(log), offset=0)
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["one"]
    with open(log, "a") as f:
        f.write("two\n")
    log.rename(workspace / "b.log.1")
    log.write_text("new\n")
    (workspace / "b.log.1").unlink()  # compressed away
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["two"] and "rotated (now " in update.notice and "(deleted)" in update.notice
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["new"]


async def test_the_old_file_is_read_for_as_long_as_its_writer_adds_to_it(box: Box, workspace: Path) -> None:
    """The switch waits for a read that finds the old file where the last one left it."""
    log = workspace / "c.log"
    log.write_text("one\n")
    follower = LogFollower(str(log), offset=0)
    follower.consume(await box.read_log(follower.cursor()))
    with open(log, "a", buffering=1) as daemon:
        log.rename(f"{log}.1")
        log.write_text("new\n")
        got = []
        for n in range(3):  # a poll, then the daemon writes one more line to the file it still has open
            got += follower.consume(await box.read_log(follower.cursor())).lines
            daemon.write(f"late {n}\n")
    for _ in range(2):
        got += follower.consume(await box.read_log(follower.cursor())).lines
    assert got == ["late 0", "late 1", "late 2", "new"]


async def test_copytruncate_copy_is_read_first_and_an_older_look_alike_is_not(box: Box, workspace: Path) -> None:
    """copytruncate's copy is made after the last read: an older file that happens to hold the
    same bytes (the last run's log of the same program) is not read as the rest of this one."""
    log = workspace / "d.log"
    log.write_text("starting\n" * 5)
    older = workspace / "d.log.2"
    older.write_text("starting\n" * 5 + "the last run's line\n")
    os.utime(older, (1_000_000_000, 1_000_000_000))
    follower = LogFollower(str(log), offset=0)
    follower.consume(await box.read_log(follower.cursor()))
    log.write_text("fresh\n")  # truncated in place, and no copy made
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["fresh"] and "truncated; reading from its start" in update.notice

    with open(log, "a") as f:
        f.write("unread\n")
    shutil.copyfile(log, workspace / "d.log.1")  # copytruncate
    os.truncate(log, 0)
    log.write_text("new\n")
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["unread"] and "reading the rest from its copy" in update.notice
    assert update.notice.endswith("d.log.1 first")
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["new"]


@pytest.mark.slow
async def test_the_log_pane_follows_a_rotation_through_the_same_reader(tmp_path: Path, workspace: Path) -> None:
    f = tmp_path / "pane.toml"
    f.write_text(CONFIG.format(ws=workspace, python=sys.executable).replace("[target]\n",
                                                                            "[target]\npoll_interval = 0.2\n"))
    log = workspace / "logs" / "hello.log"
    log.parent.mkdir()
    log.write_text("a 0\n")
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        app.box_screen.open_stage_log("hello")
        view = app.box_screen.query_one(LogView)

        def shown() -> list[str]:
            view.flush_now()
            return [line for line in view.lines if type(line) is str]

        await pilot_until(pilot, lambda: shown() == ["a 0"])
        with open(log, "a", buffering=1) as writer:  # the daemon, still writing as LOG is rotated
            writer.write("a 1\n")
            log.rename(f"{log}.1")
            writer.write("a 2\npartial")
            writer.flush()
        log.write_text("b 0\n")
        await pilot_until(pilot, lambda: "b 0" in shown())
        assert shown() == ["a 0", "a 1", "a 2", "partial", "b 0"]
        notices = [line for line in view.lines if type(line) is not str]
        assert any("rotated (now " in n for n in notices)




# ------------------------------------------------------------ not a regular file


@pytest.fixture
def specials(workspace: Path):
    """A FIFO nobody writes to, a character device that never ends, a listening unix socket."""
    fifo = workspace / "fifo.log"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(workspace / "s.log"))
    sock.listen()
    yield {"fifo": str(fifo), "character device": "/dev/zero", "socket": str(workspace / "s.log")}
    sock.close()


@pytest.mark.slow
def test_special_files_are_refused_at_once(cfg_file: Path, specials: dict[str, str]) -> None:
    for kind, path in specials.items():
        for argv in (["tail", path], ["tail", path, "--follow"], ["check", "trainlog", path],
                     ["check", "gguf", path]):
            r = run_cli("--config", str(cfg_file), *argv, timeout=30)  # blocked in open(): TimeoutExpired
            assert r.returncode != 0 and r.stdout == "", (argv, r)
            assert len(r.stderr.splitlines()) == 1 and f"not a regular file: {kind}" in r.stderr, (argv, r.stderr)


async def test_a_special_file_leaves_the_serve_probe_serving(box: Box, workspace: Path, specials) -> None:
    fifo = specials["fifo"]
    chunk = await box.read_log(LogFollower(fifo, last_lines=10).cursor())
    assert chunk.error == "not a regular file: fifo" and chunk.special == "fifo" and not chunk.missing
    with pytest.raises(BoxError, match="not a regular file: fifo"):
        await box.read_range(fifo, 0, 10)
    # A FIFO among the report files and the stage records costs an error entry, not the probe.
    (workspace / "runs").mkdir()
    os.mkfifo(workspace / "runs" / "summary.json")
    record = workspace / ".samai" / "state" / "hello.json"
    record.parent.mkdir(parents=True)
    os.mkfifo(record)
    log = workspace / "ok.log"
    log.write_text("still served\n")
    try:
        snap = await box.snapshot(logs=[LogFollower(str(log), last_lines=5).cursor(),
                                        LogFollower(specials["socket"], last_lines=5).cursor()],
                                  reports=["runs/*.json"], processes=False)
    finally:
        record.unlink()  # the test's clean-up reads stage records (with a tool of its own)
    assert snap.logs[0].data == b"still served\n" and snap.logs[1].special == "socket"
    refused = {Path(e["what"]).name: e["error"] for e in snap.errors}
    assert refused == {"summary.json": "not a regular file: fifo", "hello.json": "not a regular file: fifo"}


# ------------------------------------------------------------ where a run's log starts (issue 46, item 3)


async def test_the_follower_marks_a_files_first_line_and_no_other(box: Box, workspace: Path) -> None:
    """A run's header counts only as its log's first line (remote/box/chainline.py): the follower
    says which line that is, read from byte 0 of a file (the first read, or the new file of a
    rename rotation, its first line in pieces included), never a line read in the middle or the
    first line of a file truncated in place (whatever its writer writes next)."""
    log = workspace / "e.log"
    log.write_text("=== header one\nstep 1\n")
    follower = LogFollower(str(log), offset=0, max_bytes=8)  # the first line comes in two reads
    seen = []
    while True:
        update = follower.consume(await box.read_log(follower.cursor()))
        seen.append((update.lines, update.first_line))
        if not update.more:
            break
    assert [s for s in seen if s[1] is not None] == [(["=== header one"], 0)]
    with open(log, "a") as f:
        f.write("step 2\n")
    assert follower.consume(await box.read_log(follower.cursor())).first_line is None
    log.rename(f"{log}.1")
    log.write_text("=== header two\nstep 1\n")
    lines, first = [], []
    while "step 1" not in lines[1:]:  # the old file read to its end, then the new one from its start
        update = follower.consume(await box.read_log(follower.cursor()))
        first += [len(lines) + update.first_line] if update.first_line is not None else []
        lines += update.lines
    assert lines == ["step 2", "=== header two", "step 1"][-len(lines):] and [lines[i] for i in first] == [
        "=== header two"]
    log.write_text("=== cut\n")  # truncated in place: the same inode, shorter
    update = follower.consume(await box.read_log(follower.cursor()))
    assert update.lines == ["=== cut"] and update.first_line is None and "truncated" in (update.notice or "")
    middle = LogFollower(str(log), last_lines=1)
    log.write_text("first\nsecond\nthird\n")
    update = middle.consume(await box.read_log(middle.cursor()))
    assert update.lines == ["third"] and update.first_line is None
