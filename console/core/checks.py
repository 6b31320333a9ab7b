"""The `check` commands: a file on the box (read through the Box, so remote files cost only what
the check needs) judged by the same code the live panes use."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from samai.console.core.chunked_lines import piece_follower
from samai.console.core.problems import Problem, has_errors  # noqa: F401 (checkers' callers import has_errors here)
from samai.remote.box import gguf_check
from samai.remote.box.logfiles import open_regular
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import LogFollower
from samai.remote.model import Severity

if TYPE_CHECKING:
    from samai.console.core.training.trainlog import TrainLogResult

CHECK_READ = 4 * 1024 * 1024  # one read of a checked file: its bytes and their lines are what is held at once


class Unreadable(Exception):
    """The file cannot be read at all: exit 2, not a finding."""


@dataclass(frozen=True)
class Projector:
    """An mmproj file's figures (general.architecture "clip"), each None when the file lacks it."""

    projector_type: str | None
    has_vision_encoder: bool | None
    projection_dim: int | None  # the embedding size it feeds the text model: must be the model's
    image_size: int | None
    patch_size: int | None
    embedding_length: int | None  # the vision tower's own
    block_count: int | None

    @classmethod
    def from_raw(cls, raw: object) -> Projector | None:
        """The box checker's dict, each figure kept only if it has the type it should."""
        if not isinstance(raw, Mapping):
            return None
        text, flag = raw.get("projector_type"), raw.get("has_vision_encoder")
        return cls(text if isinstance(text, str) else None, flag if isinstance(flag, bool) else None,
                   *(_count(raw.get(k)) for k in ("projection_dim", "image_size", "patch_size", "embedding_length",
                                                   "block_count")))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class GgufResult:
    """A GGUF header's check: the box checker's figures and verdict, with the bytes it cost."""

    path: str
    ok: bool
    size: int
    version: int | None
    tensor_count: int | None
    kv_count: int | None
    alignment: int | None
    header_end: int | None  # where the last tensor info ends
    data_offset: int | None
    data_end: int | None  # where the last tensor's data ends: all a loader needs
    expected_size: int | None
    size_note: str | None  # why a file under expected_size is whole (a vocab-only file)
    last_tensor: str | None
    bytes_read: int
    problems: tuple[Problem, ...]
    deep: bool = False  # gguf-py's full read was run as well
    architecture: str | None = None  # general.architecture
    embedding_length: int | None = None  # a text model's {architecture}.embedding_length
    projector: Projector | None = None  # an mmproj file's figures

    @property
    def is_projector(self) -> bool:
        return self.projector is not None

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON (its keys and their order are a contract)."""
        return {"path": self.path, "ok": self.ok, "size": self.size, "version": self.version,
                "tensor_count": self.tensor_count, "kv_count": self.kv_count, "alignment": self.alignment,
                "header_end": self.header_end, "data_offset": self.data_offset, "data_end": self.data_end,
                "expected_size": self.expected_size, "size_note": self.size_note,
                "last_tensor": self.last_tensor, "bytes_read": self.bytes_read, "deep": self.deep,
                "problems": [{"code": p.code, "message": p.message, "severity": p.severity} for p in self.problems],
                "architecture": self.architecture, "embedding_length": self.embedding_length,
                "projector": asdict(self.projector) if self.projector else None}


async def line_batches(box: Box, path: str, *, pieces: bool = False,
                       read: dict | None = None) -> AsyncIterator[list[str]]:
    """The lines of a text file on the box, one read at a time, decoded the way the log pane decodes
    them; with pieces, the way a training log is read (a line of megabytes comes in pieces, see longlines).
    read: given, it gets the file's "mtime" as the last read saw it."""
    follower = (piece_follower if pieces else LogFollower)(path, offset=0, max_bytes=CHECK_READ)
    while True:
        chunk = await box.read_log(follower.cursor())
        if read is not None and chunk.mtime is not None:
            read["mtime"] = chunk.mtime
        update = follower.consume(chunk)
        if follower.missing:
            raise Unreadable(update.notice or f"{path}: cannot be read")
        if update.more:
            yield update.lines
            continue
        last = follower.decoder.flush()
        yield update.lines + ([last] if last is not None else [])
        return


async def read_lines(box: Box, path: str) -> list[str]:
    """Every line of a text file on the box (for checks that keep every item anyway)."""
    return [line async for batch in line_batches(box, path) for line in batch]


async def check_trainlog(box: Box, path: str) -> TrainLogResult:
    """check_trainlog over a log on the box, streamed: memory holds the points kept, never the log."""
    from samai.console.core.training.trainlog import TrainLogCheck

    check = TrainLogCheck()
    async for batch in line_batches(box, path, pieces=True):
        check.feed(batch)
    return check.result()


async def check_gguf(box: Box, path: str, *, expect_tensors: int | None, expect_last: str | None,
                     local: bool, deep: bool = False) -> GgufResult:
    """The GGUF header checked from byte ranges: a remote 18 GB file costs a few MB, and the console
    what the box's own check costs (on a local target it reads the file as the box's tool does:
    no probe to start, no thread waiting on the loop). With deep, on a local file, gguf-py's
    GGUFReader reads it as well (its whole vocabulary: seconds and hundreds of MB for a real model)."""
    if local:
        return await asyncio.to_thread(_check_local_gguf, path, expect_tensors, expect_last, deep)
    try:
        size = await box.file_size(path)
    except BoxError as e:
        raise Unreadable(str(e)) from e
    loop = asyncio.get_running_loop()
    bytes_read = 0

    def read_at(offset: int, length: int) -> bytes:
        nonlocal bytes_read
        end = min(offset + length, size) - 1
        if end < offset:
            return b""
        data = asyncio.run_coroutine_threadsafe(box.read_range(path, offset, end), loop).result()
        bytes_read += len(data)
        return data

    raw = await asyncio.to_thread(gguf_check.check, read_at, size, expect_tensors, expect_last)
    return _gguf_result(path, size, bytes_read, raw)


def _check_local_gguf(path: str, expect_tensors: int | None, expect_last: str | None, deep: bool) -> GgufResult:
    """check_gguf on this machine's file, read as the box's tool reads it (regular files only)."""
    try:
        fd, st = open_regular(path)
    except OSError as e:
        raise Unreadable(f"{path}: {e.strerror or e}") from e
    bytes_read = 0

    def read_at(offset: int, length: int) -> bytes:
        nonlocal bytes_read
        data = os.pread(fd, max(0, min(length, st.st_size - offset)), offset) if offset < st.st_size else b""
        bytes_read += len(data)
        return data

    try:
        raw = gguf_check.check(read_at, st.st_size, expect_tensors, expect_last)
    finally:
        os.close(fd)
    result = _gguf_result(path, st.st_size, bytes_read, raw)
    if deep and result.ok:
        problems = result.problems + tuple(_cross_check(path, result))
        result = replace(result, problems=problems, ok=not problems, deep=True)
    return result


def _gguf_result(path: str, size: int, bytes_read: int, raw: Mapping[str, Any]) -> GgufResult:
    """The box checker's JSON dict, typed once, here at the edge."""
    return GgufResult(path=path, ok=raw["ok"], size=size, version=raw.get("version"),
                      tensor_count=raw.get("tensor_count"), kv_count=raw.get("kv_count"),
                      alignment=raw.get("alignment"), header_end=raw.get("header_end"),
                      data_offset=raw.get("data_start"), data_end=raw.get("data_end"),
                      expected_size=raw.get("expected_size"), size_note=raw.get("size_note"),
                      last_tensor=raw.get("last_tensor"),
                      bytes_read=bytes_read, problems=tuple(_problem(p) for p in raw["problems"]),
                      architecture=arch if isinstance(arch := raw.get("architecture"), str) else None,
                      embedding_length=_count(raw.get("embedding_length")),
                      projector=Projector.from_raw(raw.get("projector")))


def _problem(raw: Mapping[str, Any]) -> Problem:
    severity: Severity = raw["severity"]
    return Problem(raw["code"], severity, raw["message"])


def _cross_check(path: str, result: GgufResult) -> list[Problem]:
    """A second opinion on a local, healthy-looking file: gguf-py's own reader."""
    from gguf import GGUFReader

    if not os.path.isfile(path):
        return []
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reference reader refusing the file is the finding itself
        return [Problem("reader_refused", "error", f"gguf-py's GGUFReader: {e}")]
    found = []
    if len(reader.tensors) != result.tensor_count:
        found.append(Problem("reader_disagrees", "error",
                             f"GGUFReader sees {len(reader.tensors)} tensors, the header {result.tensor_count}"))
    elif reader.tensors and reader.tensors[-1].name != result.last_tensor:
        found.append(Problem("reader_disagrees", "error", f"GGUFReader's last tensor is {reader.tensors[-1].name}"))
    if int(reader.data_offset) != result.data_offset:
        found.append(Problem("reader_disagrees", "error",
                             f"GGUFReader's data starts at {reader.data_offset}, the header's at {result.data_offset}"))
    return found
