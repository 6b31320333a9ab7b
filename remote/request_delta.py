"""What the running probe holds of the last request, so that the next one says only what changed.

A poll repeats most of its request: the same workspace, artifacts, report globs and log
markers, each poll; only offsets and a few marks move. Sent whole, the TUI's request is several
KB, which a lossy link pays for in extra round trips on every poll. Against the last request
the probe answered (its "held" mark), the same poll is a few hundred bytes. The format is the
box's (remote/box/request_cache.py); this side writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class HeldRequest:
    """The last request the probe of one stream answered, and its mark."""

    def __init__(self) -> None:
        self.request: Mapping[str, Any] | None = None
        self.mark: str | None = None

    def compact(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """request as the probe should be sent it: whole, or as changes to the held one."""
        held = self.request
        if held is None or self.mark is None:
            return dict(request)
        out: dict[str, Any] = {"base": self.mark}
        same = [k for k, v in request.items() if k != "logs" and k in held and held[k] == v]
        if same:
            out["same"] = same
        out.update((k, v) for k, v in request.items() if k != "logs" and k not in same)
        if "logs" in request:
            out["logs"] = compact_logs(held.get("logs") or [], request["logs"])
        return out

    def answered(self, request: Mapping[str, Any], mark: Any) -> None:
        """The probe answered request (whole) and holds it as mark; no mark: it holds nothing."""
        self.request, self.mark = (request, mark) if isinstance(mark, str) else (None, None)

    def forget(self) -> None:
        self.request = self.mark = None


def compact_logs(held: list[Mapping[str, Any]], logs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each log entry as changes to a held entry for the same file and markers, else whole."""
    by_key = {_log_key(e): i for i, e in enumerate(held)}
    out = []
    for entry in logs:
        i = by_key.get(_log_key(entry))
        if i is None:
            out.append(dict(entry))
            continue
        base = held[i]
        delta: dict[str, Any] = {"like": i}
        delta.update((k, v) for k, v in entry.items() if k not in base or base[k] != v)
        dropped = [k for k in base if k not in entry]
        if dropped:
            delta["drop"] = dropped
        out.append(delta)
    return out


def _log_key(entry: Mapping[str, Any]) -> tuple[Any, str]:
    return entry.get("path"), repr(entry.get("markers"))
