"""The last request a --serve probe answered, so that the next one need only say what changed.

Runs ON the box, imported by probe.py. Standard library only, Python >= 3.8.

A poll repeats most of its request: the same workspace, artifacts and report globs, the same
logs with the same markers; only offsets and a few marks move. A request that names the last
one ("base": the "held" mark of its reply) is read as that request with changes:

  "same": [KEY, ...]       top-level keys whose values are the held request's
  other top-level keys     as given (a key neither given nor in "same" is absent)
  "logs": [ENTRY, ...]     each entry in full, or {"like": I, "drop": [KEY], KEY: VALUE, ...}: the
                           held request's logs[I] with the given keys changed and "drop" removed

The expanded request is then checked and answered as any other (probe.check_request), and
held for the next. A base that is not the held request's mark (another probe, or a reply
that never arrived) is refused with "held_unknown", and the console sends the request whole.
"""

from __future__ import annotations

import binascii
import os
from typing import Any

DELTA_KEYS = ("base", "same")


class HeldUnknown(ValueError):
    """The request names a base this probe does not hold."""


class HeldRequest(object):
    def __init__(self) -> None:
        self.session = binascii.hexlify(os.urandom(6)).decode()  # no other probe's marks match
        self.count = 0
        self.request: dict[str, Any] | None = None
        self.mark: str | None = None

    def expand(self, req: Any) -> Any:
        """The whole request a (possibly delta) request stands for."""
        if not isinstance(req, dict) or "base" not in req:
            return req
        if req["base"] != self.mark or self.request is None:
            raise HeldUnknown("this probe does not hold request %r: send it whole" % (req["base"],))
        same = req.get("same") or []
        if not isinstance(same, list) or not all(isinstance(k, str) for k in same):
            raise ValueError("request.same must be a list of keys")
        out = dict((k, self.request[k]) for k in same if k in self.request)
        out.update((k, v) for k, v in req.items() if k not in DELTA_KEYS and k != "logs")
        if "logs" in req:
            out["logs"] = expand_logs(self.request.get("logs") or [], req["logs"])
        return out

    def keep(self, req: dict[str, Any]) -> str:
        """Hold req (expanded) as the base of the next request; its mark."""
        self.count += 1
        self.request, self.mark = req, "%s.%d" % (self.session, self.count)
        return self.mark


def expand_logs(held: list[dict[str, Any]], entries: Any) -> Any:
    if not isinstance(entries, list):
        return entries  # check_request names what is wrong with it
    return [expand_log(held, e) for e in entries]


def expand_log(held: list[dict[str, Any]], entry: Any) -> Any:
    if not isinstance(entry, dict) or "like" not in entry:
        return entry
    index = entry["like"]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(held):
        raise ValueError("request.logs: like %r names no held log" % (index,))
    drop = entry.get("drop") or []
    if not isinstance(drop, list):
        raise ValueError("request.logs: drop must be a list of keys")
    out = dict((k, v) for k, v in held[index].items() if k not in drop)
    out.update((k, v) for k, v in entry.items() if k not in ("like", "drop"))
    return out
