"""The audit log: one JSON line per destructive action, append-only, secrets redacted.

Fail closed: an action whose audit line cannot be written is not carried out, so the log is
checked before the action (it opens and has room) and the line written right after it."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_FREE_BYTES = 256 * 1024

_SECRET_PATTERNS = (
    re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)\b((?:token|secret|password|passwd|api[_-]?key)\s*[=:]\s*)[^\s'\"]+"),
    re.compile(r"\b()hf_[A-Za-z0-9]{20,}"),
)


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    return text


class AuditError(Exception):
    """The audit log cannot be written, so the action must not run."""


@dataclass
class AuditLog:
    path: Path

    def ensure_writable(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                st = os.fstatvfs(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise AuditError(f"audit log {self.path} cannot be written: {e.strerror}") from e
        if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
            raise AuditError(f"audit log {self.path} cannot be written: no space left on its disk")

    def record(self, **entry: Any) -> None:
        entry = {"time": round(time.time(), 3), **entry}
        line = redact(json.dumps(entry, ensure_ascii=False, default=str)) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise AuditError(f"audit log {self.path} cannot be written: {e.strerror}") from e
