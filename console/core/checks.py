"""The `check` commands: a file on the box (read through the Box, so remote files cost only what
the check needs) judged by the same code the live panes use."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from samai.console.core.problems import has_errors  # noqa: F401 (checkers' callers import it here)
from samai.remote.box import gguf_check
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import LogFollower

CHECK_READ = 4 * 1024 * 1024  # one read of a checked file: its bytes and their lines are what is held at once


class Unreadable(Exception):
    """The file cannot be read at all: exit 2, not a finding."""


async def line_batches(box: Box, path: str) -> AsyncIterator[list[str]]:
    """The lines of a text file on the box, one read at a time, decoded the way the log pane decodes them."""
    follower = LogFollower(path, offset=0, max_bytes=CHECK_READ)
    while True:
        update = follower.consume(await box.read_log(follower.cursor()))
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


async def check_trainlog(box: Box, path: str) -> dict[str, Any]:
    """check_trainlog over a log on the box, streamed: memory holds the points kept, never the log."""
    from samai.console.core.trainlog import TrainLogCheck

    check = TrainLogCheck()
    async for batch in line_batches(box, path):
        check.feed(batch)
    return check.result()


async def check_gguf(box: Box, path: str, *, expect_tensors: int | None, expect_last: str | None,
                     local: bool) -> dict[str, Any]:
    """The GGUF header checked from byte ranges: a remote 18 GB file costs a few MB."""
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
    result = {"path": path, "ok": raw["ok"], "size": size, "version": raw.get("version"),
              "tensor_count": raw.get("tensor_count"), "kv_count": raw.get("kv_count"),
              "alignment": raw.get("alignment"), "data_offset": raw.get("data_start"),
              "expected_size": raw.get("expected_size"), "last_tensor": raw.get("last_tensor"),
              "bytes_read": bytes_read,
              "problems": [{"code": p["code"], "message": p["message"], "severity": p["severity"]}
                           for p in raw["problems"]]}
    if local and result["ok"]:
        result["problems"] += await asyncio.to_thread(_cross_check, path, result)
        result["ok"] = not result["problems"]
    return result


def _cross_check(path: str, result: dict[str, Any]) -> list[dict[str, str]]:
    """A second opinion on a local, healthy-looking file: gguf-py's own reader."""
    from gguf import GGUFReader

    if not os.path.isfile(path):
        return []
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reference reader refusing the file is the finding itself
        return [{"code": "reader_refused", "severity": "error", "message": f"gguf-py's GGUFReader: {e}"}]
    found = []
    if len(reader.tensors) != result["tensor_count"]:
        found.append({"code": "reader_disagrees", "severity": "error",
                      "message": f"GGUFReader sees {len(reader.tensors)} tensors, the header {result['tensor_count']}"})
    elif reader.tensors and reader.tensors[-1].name != result["last_tensor"]:
        found.append({"code": "reader_disagrees", "severity": "error",
                      "message": f"GGUFReader's last tensor is {reader.tensors[-1].name}"})
    return found
