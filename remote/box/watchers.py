"""What the watchers of this box share: who watches, who leads, what was sent, what is acknowledged.

Runs ON the box (standard library only, Python >= 3.8), in WORKSPACE/.samai/watch/:

  W-ID.json     each watcher's heartbeat (who, host, pid, since, last poll, last sent, last error)
  leader.json   {"id", "until"}: the one watcher that sends (a lease, renewed with each beat)
  ledger.json   the leader's: the alerts sent and still standing, and each stage's last status
  acks.json     {KEY: {"by", "at", "text"}}: alerts an operator acknowledged (no more repeats)
  lock          flock'd around every read-modify-write

Request on stdin: {"workspace", "op": "read" | "beat" | "ack", ...}
  read                                      writes nothing (a read-only console may ask)
  beat  {"id", "heartbeat": {...}, "lease_s", "ledger": {...} | null, "release"?}
        writes the heartbeat, takes or renews the lease when it is free, expired or its own, and
        (the leader only) the ledger; release: the leader's last beat, the lease left free;
        stale heartbeats (a day old) of others are removed
  ack   {"keys": [...], "by", "text": {KEY: text}}
Reply: {"watchers": [...], "leader": {...} | null, "leading": bool, "ledger": {...}, "acks": {...}, "now"}

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

FOLDER = (".samai", "watch")
MAX_FILE = 256 * 1024  # one heartbeat, the ledger, the acks: far below this
MAX_WATCHERS = 32
MAX_ACKS = 500
STALE_S = 86400.0  # another watcher's heartbeat this old is removed
WATCHER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def read_json(fd: int, name: str) -> Any:
    """A JSON file of the folder, or None: missing, too big, a link, not JSON."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    try:
        data = os.read(f, MAX_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(f)
    if len(data) > MAX_FILE:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def write_json(fd: int, name: str, value: Any) -> None:
    replace_in(fd, name, [json.dumps(value).encode("utf-8")], mode=0o600)


def _object(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def watchers(fd: int) -> List[Dict[str, Any]]:
    names = sorted(n for n in os.listdir(fd) if n.startswith("W-") and n.endswith(".json"))[:MAX_WATCHERS]
    return [beat for beat in (_object(read_json(fd, n)) for n in names) if beat]


def state(fd: int, own: Optional[str] = None) -> Dict[str, Any]:
    leader = _object(read_json(fd, "leader.json")) or None
    now = time.time()
    return {"watchers": watchers(fd), "leader": leader, "now": now,
            "leading": bool(own and leader and leader.get("id") == own),
            "ledger": _object(read_json(fd, "ledger.json")), "acks": _object(read_json(fd, "acks.json"))}


def _lease_free(leader: Optional[Dict[str, Any]], own: str, now: float) -> bool:
    if not leader or leader.get("id") == own:
        return True
    until = leader.get("until")
    return not isinstance(until, (int, float)) or isinstance(until, bool) or until < now


def beat(fd: int, req: Dict[str, Any]) -> Dict[str, Any]:
    own = req["id"]
    if not isinstance(own, str) or not WATCHER_ID.match(own):
        raise ValueError("id must be letters, digits, '_' or '-' (at most 64)")
    lease = float(req.get("lease_s") or 30.0)
    heartbeat = _object(req.get("heartbeat"))
    now = time.time()
    write_json(fd, "W-%s.json" % own, dict(heartbeat, id=own, written=now))
    if _lease_free(_object(read_json(fd, "leader.json")) or None, own, now):
        if isinstance(req.get("ledger"), dict):
            write_json(fd, "ledger.json", req["ledger"])
        # release: a watcher that ends leaves the lease free (the next cron run need not wait it out)
        until = 0.0 if req.get("release") is True else now + lease
        write_json(fd, "leader.json", {"id": own, "until": until, "who": heartbeat.get("who")})
    for name in os.listdir(fd):
        if name.startswith("W-") and name.endswith(".json") and name != "W-%s.json" % own:
            try:
                if now - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime > STALE_S:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    return state(fd, own)


def ack(fd: int, req: Dict[str, Any]) -> Dict[str, Any]:
    keys, texts = req["keys"], _object(req.get("text"))
    if not isinstance(keys, list) or not all(isinstance(k, str) and len(k) <= 1000 for k in keys):
        raise ValueError("keys must be a list of strings")
    acks = _object(read_json(fd, "acks.json"))
    now = time.time()
    for key in keys:
        acks[key] = {"by": str(req.get("by", ""))[:200], "at": now, "text": str(texts.get(key, ""))[:300]}
    newest = sorted(acks.items(), key=lambda kv: _object(kv[1]).get("at") or 0, reverse=True)[:MAX_ACKS]
    write_json(fd, "acks.json", dict(newest))
    return state(fd)


def handle(req: Dict[str, Any]) -> Dict[str, Any]:
    op = req["op"]
    if op not in ("read", "beat", "ack"):
        raise ValueError("op must be read, beat or ack")
    root = open_root(workspace_root(req["workspace"]))
    try:
        try:
            fd = open_folder(root, FOLDER, create=op != "read", mode=0o700)
        except FileNotFoundError:  # read: nobody watches yet
            return {"watchers": [], "leader": None, "leading": False, "ledger": {}, "acks": {}, "now": time.time()}
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
