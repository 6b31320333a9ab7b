"""What the watchers of this box share: who watches, who leads, what was sent, what is acknowledged.

Runs ON the box (standard library only, Python >= 3.8), in WORKSPACE/.samai/watch/:

  W-ID.json     each watcher's heartbeat (who, host, pid, since, last poll, last sent, last error)
  leader.json   {"id", "until", "since", "who"}: the one watcher that sends (a lease, renewed with
                each beat; held only while its holder's heartbeat is live)
  ledger.json   the leader's: the alerts sent and still standing, and each stage's last status
  acks.json     {KEY: {"by", "at", "text"}}: alerts an operator acknowledged (no more repeats)
  lock          flock'd around every read-modify-write

Request on stdin: {"workspace", "op": "read" | "beat" | "ack", ...}
  read                                      writes nothing (a read-only console may ask)
  beat  {"id", "heartbeat": {...}, "lease_s", "ledger": {...} | null, "release"?}
        writes the heartbeat, takes or renews the lease when it is free, expired, its holder
        silent, or its own, and (the leader only) the ledger; release: the leader's last beat,
        the lease left free; stale heartbeats (a day old) of others are removed
  ack   {"keys": [...], "by", "text": {KEY: text}}
Reply: {"watchers": [...], "leader": {"id", "since", "who"} | null (only while its holder beats),
        "leading": bool, "ledger": {...}, "acks": {...}, "now", "problems": [what could not be read]}
(wire.py: WatchersRequest, WatchersReply.)

Every file is read bounded and parsed defensively: another process (or person) may write anything
here. The folder is opened inside the workspace without following symlinks (confine.py)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional

from .atomic import replace_in
from .confine import open_folder, open_root, workspace_root
from .procfs import serve
from .wire import Leader, WatchersReply, WatchersRequest

FOLDER = (".samai", "watch")
MAX_FILE = 256 * 1024  # one heartbeat, the ledger, the acks: far below this
MAX_WATCHERS = 32
MAX_ACKS = 500
STALE_S = 86400.0  # another watcher's heartbeat this old is removed
WATCHER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A lease is only as good as its holder's heartbeat: it lapses when the holder has not beaten for
# this many of its intervals (bounded both ways), whatever `until` says, and `until` counts at most
# MAX_LEASE_S ahead. A forged leader.json, or one left by a watcher that died, holds nobody back long.
LIVE_INTERVALS = 3
MIN_LIVE_S = 30.0
MAX_LEASE_S = 900.0
FUTURE_S = 5.0  # a beat written later than now by more than this was not written by this tool


def number(value: Any) -> Optional[float]:
    """A finite number read from the folder, or None (a 400-digit int, inf and NaN are none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def read_json(fd: int, name: str, problems: Optional[List[str]] = None) -> Any:
    """A JSON file of the folder, or None: missing, too big, a link, not JSON (each but missing
    said in problems: a read limit never cuts silently)."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        _said(problems, "%s: not readable (%s)" % (name, os.strerror(e.errno or 0)))
        return None
    try:
        data = os.read(f, MAX_FILE + 1)
    except OSError as e:
        _said(problems, "%s: not readable (%s)" % (name, os.strerror(e.errno or 0)))
        return None
    finally:
        os.close(f)
    if len(data) > MAX_FILE:
        _said(problems, "%s: more than %d bytes, not read" % (name, MAX_FILE))
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        _said(problems, "%s: not JSON" % name)
        return None


def _said(problems: Optional[List[str]], problem: str) -> None:
    if problems is not None:
        problems.append(problem)


def write_json(fd: int, name: str, value: Any) -> None:
    replace_in(fd, name, [json.dumps(value).encode("utf-8")], mode=0o600)


def _object(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _beat_names(fd: int) -> List[str]:
    return sorted(n for n in os.listdir(fd) if n.startswith("W-") and n.endswith(".json"))


def watchers(fd: int, problems: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    names = _beat_names(fd)
    if len(names) > MAX_WATCHERS:
        _said(problems, "%d heartbeat files, the first %d read" % (len(names), MAX_WATCHERS))
    return [beat for beat in (_object(read_json(fd, n, problems)) for n in names[:MAX_WATCHERS]) if beat]


def live(beat: Dict[str, Any], now: float) -> bool:
    """Whether a heartbeat is recent: written within a few of its watcher's intervals."""
    written, interval = number(beat.get("written")), number(beat.get("interval"))
    allowed = min(max(LIVE_INTERVALS * (interval if interval and interval > 0 else 0.0), MIN_LIVE_S), MAX_LEASE_S)
    return written is not None and -FUTURE_S <= now - written <= allowed


def holder(fd: int, now: float, problems: Optional[List[str]] = None) -> Optional[Leader]:
    """The lease as it holds now: {"id", "who", "since"} while its holder beats and `until` is
    ahead; None when it is free (missing, released, run out, or its holder silent)."""
    lease = _object(read_json(fd, "leader.json", problems))
    own, until = lease.get("id"), number(lease.get("until"))
    if not isinstance(own, str) or not WATCHER_ID.match(own) or until is None or until < now:
        return None
    beat = _object(read_json(fd, "W-%s.json" % own))
    if not live(beat, now):
        return None
    since = number(lease.get("since"))
    who = lease.get("who")
    return {"id": own, "since": since if since is not None and since <= now else now,
            "who": who[:200] if isinstance(who, str) else ""}


def state(fd: int, own: Optional[str] = None) -> WatchersReply:
    problems = []  # type: List[str]
    now = time.time()
    leader = holder(fd, now, problems)
    return {"watchers": watchers(fd, problems), "leader": leader, "now": now,
            "leading": bool(own and leader and leader.get("id") == own),
            "ledger": _object(read_json(fd, "ledger.json", problems)),
            "acks": _object(read_json(fd, "acks.json", problems)), "problems": problems}


def beat(fd: int, req: WatchersRequest) -> WatchersReply:
    own = req["id"]
    if not isinstance(own, str) or not WATCHER_ID.match(own):
        raise ValueError("id must be letters, digits, '_' or '-' (at most 64)")
    lease = min(max(number(req.get("lease_s")) or MIN_LIVE_S, 1.0), MAX_LEASE_S)
    heartbeat = _object(req.get("heartbeat"))
    now = time.time()
    write_json(fd, "W-%s.json" % own, dict(heartbeat, id=own, written=now))
    held = holder(fd, now)
    if held is None or held["id"] == own:
        if isinstance(req.get("ledger"), dict):
            write_json(fd, "ledger.json", req["ledger"])
        # release: a watcher that ends leaves the lease free (the next cron run need not wait it out)
        until = 0.0 if req.get("release") is True else now + lease
        since = held["since"] if held is not None else now
        write_json(fd, "leader.json", {"id": own, "until": until, "since": since, "who": heartbeat.get("who")})
    for name in _beat_names(fd):
        if name != "W-%s.json" % own:
            try:
                if now - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime > STALE_S:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    return state(fd, own)


def ack(fd: int, req: WatchersRequest) -> WatchersReply:
    keys, texts = req["keys"], _object(req.get("text"))
    if not isinstance(keys, list) or not all(isinstance(k, str) and len(k) <= 1000 for k in keys):
        raise ValueError("keys must be a list of strings")
    acks = _object(read_json(fd, "acks.json"))
    now = time.time()
    for key in keys:
        acks[key] = {"by": str(req.get("by", ""))[:200], "at": now, "text": str(texts.get(key, ""))[:300]}
    newest = sorted(acks.items(), key=lambda kv: number(_object(kv[1]).get("at")) or 0.0, reverse=True)[:MAX_ACKS]
    write_json(fd, "acks.json", dict(newest))
    return state(fd)


def handle(req: WatchersRequest) -> WatchersReply:
    op = req["op"]
    if op not in ("read", "beat", "ack"):
        raise ValueError("op must be read, beat or ack")
    root = open_root(workspace_root(req["workspace"]))
    try:
        try:
            fd = open_folder(root, FOLDER, create=op != "read", mode=0o700)
        except FileNotFoundError:  # read: nobody watches yet
            return {"watchers": [], "leader": None, "leading": False, "ledger": {}, "acks": {}, "now": time.time(),
                    "problems": []}
    finally:
        os.close(root)
    try:
        if op == "read":
            return state(fd)
        lock = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return beat(fd, req) if op == "beat" else ack(fd, req)
        finally:
            os.close(lock)
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(serve("watchers", handle))
