"""The audit log: JSON lines in ASCII, append-only, secrets masked, and it fails closed.

Its secrets: by their shape (redact), and by where the config keeps them when the log is given
the config's SecretMask (its notification URLs, the values of the variables its `*_env` keys name).

Each action that runs has two lines with one id: an "intent" line, written and fsync'd before
the action (if it cannot be written, the action does not run), and an "outcome" line after
it. A request that was declined has only an outcome line. A write that fails half-way (a full
disk, a file size limit) leaves a torn line; the next line starts on a line of its own."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from samai.console.core.secret_mask import SecretMask

MIN_FREE_BYTES = 256 * 1024


class AuditError(Exception):
    """The audit log cannot be written, so the action must not run."""


def new_id() -> str:
    return secrets.token_hex(8)


@dataclass
class AuditLog:
    path: Path
    mask: SecretMask = field(default_factory=SecretMask)  # the config's: SecretMask.of_config

    def ensure_writable(self) -> None:
        """A courtesy check before asking the operator; the intent line is the real guarantee."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                st = os.fstatvfs(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._error(e) from e
        if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
            raise AuditError(f"audit log {self.path} cannot be written: no space left on its disk")

    def intent(self, **entry: Any) -> str:
        """Write (and fsync) what is about to be done; its id for the outcome. AuditError: do not do it."""
        entry_id = new_id()
        self._write({"id": entry_id, "phase": "intent", **entry})
        return entry_id

    def outcome(self, entry_id: str | None = None, **entry: Any) -> str:
        """Write what came of it (entry_id: its intent's; None for a request that ran nothing)."""
        entry_id = entry_id or new_id()
        self._write({"id": entry_id, "phase": "outcome", **entry})
        return entry_id

    def record(self, **entry: Any) -> None:
        """One line on its own (no intent)."""
        self.outcome(None, **entry)

    def _write(self, entry: dict[str, Any]) -> None:
        entry = self.mask.all({"time": round(time.time(), 3), **entry})
        # ASCII: a C1 control, U+0085 or U+2028 from a killed process's argv is \uXXXX, never raw (a
        # reader or terminal would act on it, or take it for a line break: one line is one entry).
        data = (json.dumps(entry, ensure_ascii=True, default=str) + "\n").encode("ascii")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)  # read: its last byte
            try:
                if _ends_torn(fd):
                    data = b"\n" + data
                written = os.write(fd, data)
                if written != len(data):  # a size limit or a full disk cut it short
                    raise OSError(28, "the line was cut short (disk full or file size limit)")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._error(e) from e

    def _error(self, e: OSError) -> AuditError:
        return AuditError(f"audit log {self.path} cannot be written: {e.strerror or e}")


def _ends_torn(fd: int) -> bool:
    """Whether the file's last line lacks its line break (an earlier write cut short)."""
    try:
        size = os.fstat(fd).st_size
        return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
    except OSError:
        return False  # not seekable (a device): nothing to mend
