"""Following logs by byte offset through the probe: no gaps, no duplicates, no mojibake."""

from __future__ import annotations

import random
from pathlib import Path

from samai.remote.boxapi import Box
from samai.remote.decode import LineDecoder
from samai.remote.follow import LogFollower
from samai.remote.model import Marker


async def _poll(box: Box, follower: LogFollower) -> tuple[list[str], list[str]]:
    """Everything the log holds right now (following `more`), and the notices seen."""
    lines, notices = [], []
    while True:
        update = follower.consume(await box.read_log(follower.cursor()))
        lines += update.lines
        if update.notice:
            notices.append(update.notice)
        if not update.more:
            return lines, notices


async def test_offsets_resume_without_gaps_or_duplicates(box: Box, workspace: Path) -> None:
    log = workspace / "a.log"
    follower = LogFollower(str(log), offset=0, max_bytes=1000)  # small reads: many boundaries
    got: list[str] = []
    n = 0
    with open(log, "w") as f:
        for burst in range(20):
            for _ in range(37 * burst % 90):
                f.write(f"line {n:05d} {'x' * (n % 50)}\n")
                n += 1
            f.write("partial-")  # a line cut by the writer, finished in the next burst
            f.flush()
            got += (await _poll(box, follower))[0]
            f.write(f"done {burst}\n")
        f.flush()
    got += (await _poll(box, follower))[0]
    expected = log.read_text().splitlines()
    assert got == expected


async def test_tail_starts_with_the_last_n_lines(box: Box, workspace: Path) -> None:
    log = workspace / "b.log"
    log.write_text("".join(f"{i}\n" for i in range(10_000)))
    lines, _ = await _poll(box, LogFollower(str(log), last_lines=5))
    assert lines == ["9995", "9996", "9997", "9998", "9999"]
    log.write_text("only\nthree\nlines")  # no final newline
    chunk = await box.tail(str(log), last_lines=10)
    assert chunk.data == b"only\nthree\nlines"


async def test_truncation_and_rotation_are_detected(box: Box, workspace: Path) -> None:
    log = workspace / "c.log"
    log.write_text("one\ntwo\n")
    follower = LogFollower(str(log), last_lines=10)
    assert (await _poll(box, follower))[0] == ["one", "two"]

    log.write_text("3\n")  # truncated in place (copytruncate)
    lines, notices = await _poll(box, follower)
    assert lines == ["3"] and "truncated" in notices[0]

    log.rename(workspace / "c.log.1")  # rotated: a new file under the old name
    log.write_text("fresh\n")
    lines, notices = await _poll(box, follower)  # the old file first: a writer may still add to it
    assert lines == [] and "rotated (now " in notices[0]
    assert notices[0].endswith("c.log.1); reading the rest of it first")
    lines, notices = await _poll(box, follower)  # still at its end a poll later: done with it
    assert lines == ["fresh"] and "reading the new one from its start" in notices[0]


async def test_truncation_that_regrew_past_the_old_offset_is_caught(box: Box, workspace: Path) -> None:
    log = workspace / "d.log"
    log.write_text("aaaa\nbbbb\n")
    follower = LogFollower(str(log), last_lines=10)
    await _poll(box, follower)
    with open(log, "r+") as f:  # same inode, rewritten, now longer than before
        f.truncate(0)
        f.write("new-1\nnew-2\nnew-3\n")
    lines, notices = await _poll(box, follower)
    assert lines == ["new-1", "new-2", "new-3"] and "truncated" in notices[0]


async def test_a_multibyte_character_split_at_the_read_boundary(box: Box, workspace: Path) -> None:
    log = workspace / "e.log"
    text = "训练 loss 下降 ✓ é😀\n" * 3
    log.write_bytes(text.encode())
    for size in (5, 6, 7, 8):  # reads that end at every position inside 2-, 3- and 4-byte characters
        lines, _ = await _poll(box, LogFollower(str(log), offset=0, max_bytes=size))
        assert lines == text.splitlines()
        assert "\ufffd" not in "".join(lines)


async def test_invalid_bytes_become_replacement_characters(box: Box, workspace: Path) -> None:
    log = workspace / "f.log"
    log.write_bytes(b"ok \xff\xfe end\n\x00bin\xc3\n")
    lines, _ = await _poll(box, LogFollower(str(log), offset=0))
    assert lines == ["ok \ufffd\ufffd end", "\x00bin\ufffd"]


async def test_a_10mb_line_is_capped_and_the_next_line_is_intact(box: Box, workspace: Path) -> None:
    log = workspace / "g.log"
    log.write_bytes(b"start\n" + b"\xe2\x82\xac" * (10 * 1024 * 1024 // 3) + b"\nafter\n")
    follower = LogFollower(str(log), offset=0, max_bytes=1024 * 1024, max_line=4096)
    lines, _ = await _poll(box, follower)
    assert lines[0] == "start" and lines[2] == "after"
    assert len(lines[1].encode()) < 4200 and "more bytes" in lines[1]
    assert "\ufffd" not in lines[1]
    assert follower.offset == log.stat().st_size


async def test_marker_hits_are_found_once_even_across_reads(box: Box, workspace: Path) -> None:
    log = workspace / "h.log"
    markers = (Marker("TRAIN_NAN", "TRAIN_NAN", "error"), Marker("CHAIN_DONE", r"CHAIN_DONE rc=\d+"))
    follower = LogFollower(str(log), markers=markers, offset=0, max_bytes=7)
    hits = []
    with open(log, "wb") as f:
        for part in (b"step 1\nTRAIN", b"_NAN at step 2\n", b"CHAIN_DO", b"NE rc=1\nnoise\n"):
            f.write(part)
            f.flush()
            while True:
                update = follower.consume(await box.read_log(follower.cursor()))
                hits += update.hits
                if not update.more:
                    break
    assert [(h.marker, h.line) for h in hits] == [("TRAIN_NAN", "TRAIN_NAN at step 2"),
                                                  ("CHAIN_DONE", "CHAIN_DONE rc=1")]
    assert hits[0].offset == len(b"step 1\n")


async def test_a_missing_log_is_reported_then_read_from_its_start(box: Box, workspace: Path) -> None:
    log = workspace / "later.log"
    follower = LogFollower(str(log), last_lines=10)
    lines, notices = await _poll(box, follower)
    assert lines == [] and "No such file" in notices[0]
    log.write_text("first\n")
    lines, notices = await _poll(box, follower)
    assert lines == ["first"] and "appeared" in notices[0]


def test_decoder_completes_a_character_split_across_feeds() -> None:
    data = "é€😀\n".encode()
    for cut in range(1, len(data)):
        d = LineDecoder()
        assert d.feed(data[:cut]) == [] and d.feed(data[cut:]) == ["é€😀"]


def test_decoder_cuts_a_long_line_on_a_character_boundary() -> None:
    d = LineDecoder(max_line=10)
    (line,) = d.feed("€€€€€€€€\n".encode())  # 24 bytes; 10 cut inside the 4th euro
    assert line.startswith("€€€ ") and "14 more bytes" in line and "\ufffd" not in line
    assert d.feed(b"next\r\n") == ["next"]


async def test_a_markers_only_watch_moves_no_bytes_and_misses_no_marker(box: Box, workspace: Path) -> None:
    log = workspace / "m.log"
    follower = LogFollower(str(log), markers=(Marker("HEALTH_OK", "HEALTH_OK"),), offset=0, max_bytes=10,
                           want_data=False)
    hits = []
    with open(log, "wb") as f:
        for part in (b"booting\nHEAL", b"TH_OK port 8080\nHEALTH_", b"OK again\n"):
            f.write(part)
            f.flush()
            while True:
                chunk = await box.read_log(follower.cursor())
                assert chunk.data == b""
                update = follower.consume(chunk)
                hits += update.hits
                if not update.more:
                    break
    assert [h.line for h in hits] == ["HEALTH_OK port 8080", "HEALTH_OK again"]
    assert follower.offset == log.stat().st_size


async def test_markers_match_within_their_own_line_only(box: Box, workspace: Path) -> None:
    log = workspace / "k.log"
    log.write_bytes(b"Traceback (most recent call last):\n  at Traceback frame\nloss a\nb nan nan\nend\n")
    markers = (Marker("TB", "^Traceback "), Marker("SPLIT", r"a\s+b"), Marker("NAN", "nan"))
    update = LogFollower(str(log), markers=markers, offset=0).consume(await box.read_log(
        LogFollower(str(log), markers=markers, offset=0).cursor()))
    assert [(h.marker, h.line) for h in update.hits] == [("TB", "Traceback (most recent call last):"),
                                                         ("NAN", "b nan nan")]


def test_decoding_whole_chunks_gives_what_decoding_byte_by_byte_gives() -> None:
    """The decoder's fast path (all complete lines of a chunk in one decode) against its line by
    line path, which feeding one byte at a time always takes: garbage, CRLF, characters split
    across reads, and lines over the cap."""
    rng = random.Random(5)
    pieces = [b"plain line", "é€😀 utf-8".encode(), b"\xff\xfe\x80 garbage", b"crlf\r", b"", b"\xe2\x82",
              b"x" * 300, "€".encode() * 90]
    data = b"".join(rng.choice(pieces) + (b"\n" if rng.random() < 0.7 else b"") for _ in range(3000))
    slow, fast = LineDecoder(max_line=256), LineDecoder(max_line=256)
    expected = [line for i in range(len(data)) for line in slow.feed(data[i:i + 1])]
    got, pos = [], 0
    while pos < len(data):
        size = rng.randint(1, 5000)
        got += fast.feed(data[pos:pos + size])
        pos += size
    assert got == expected and fast.flush() == slow.flush()
    assert any("line cut" in line for line in got) and any("\ufffd" in line for line in got)


async def test_the_last_n_lines_across_read_blocks(box: Box, workspace: Path) -> None:
    """The probe looks back in 64 KB blocks: line starts on either side of a block edge, with
    and without a final newline, and more lines asked for than the file has."""
    rng = random.Random(3)
    lines = [b"%d " % i + b"x" * rng.randint(0, 200) for i in range(1500)]
    for trailing in (b"\n", b""):
        log = workspace / f"blocks{len(trailing)}.log"
        log.write_bytes(b"\n".join(lines) + trailing)
        for n in (1, 2, 7, 499, 1000, 1499, 1500, 5000):
            chunk = await box.tail(str(log), last_lines=n, max_bytes=1 << 20)
            assert chunk.data == b"\n".join(lines[-n:]) + trailing, (n, trailing)
