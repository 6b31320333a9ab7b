"""The box probe: one JSON request on stdin, one JSON reply on stdout (or, with --serve, one
request and one reply per line for as long as stdin stays open).

Runs ON the box. Standard library only, Python >= 3.8, reads /proc directly so that one
poll costs one process start and no shell-outs. Anything unreadable becomes an error
entry in the reply; the probe itself only fails on a request it cannot parse.

Request (every key optional):
  {"workspace": PATH, "artifacts": [{"name", "path"}], "artifact_budget_s": 1.0,
   "logs": [{"path", "offset", "inode", "dev", "mtime", "drained", "older", "check", "scan_from",
             "last_lines", "max_bytes", "data": true, "markers": [{"name", "pattern", "needles"}]}],
   "ranges": [{"path", "start", "end"}], "reports": [{"glob", "max"}],
   "processes": true | false | "stages", "processes_since": MARK, "states": true, "writers": false, "binaries": [PATH],
   "users": {"top": 10, "budget_s": 2.0}, "listing": {"path", "prefix", "max"},
   "packages": [{"python", "names", "max"}], "gpus": true, "attach": false,
   "serving": {"ports": [PORT], "paths": ["/health", ...], "budget_s": 0.8}}
  A --serve probe also takes a request as changes to the last one it answered ("base", "same",
  log entries with "like": see held.py), and marks each reply with "held" for the next.
Reply: {"time", "boot_time", "boot_id", "clk_tck", "host", "disks", "artifacts", "processes",
        "listeners", "logs", "ranges", "reports", "states", "writers", "binaries", "errors"}
        and, when asked, "users": the workspace's largest entries (disk.workspace_users)
        and "listing": one folder's entries (see listing), and "packages": the distributions
        installed in each Python environment asked for (packages.py); unless asked not to,
        "gpus", "gpu_error" and "gpu_driver": every GPU NVML sees, or none and why (gpus.py),
        and "gpu_events", "gpu_events_note": the recent Xid and ECC error events (gpu_events.py);
        with processes, "memory": {"total", "available", "cgroup", "limit"} (memory_limits)
        and, when asked, "serving": each port's monitoring answers, within the budget (serving.py)
  The bytes read into "logs" and "ranges" entries are base64 in their "data"; or, when the
  request asks to "attach" them, raw after the JSON line, at the entry's "data_at" (answer).
  (wire.py: ProbeRequest, ProbeReply; check_request checks a request's every value.)

A --serve probe marks each reply's processes ("processes_mark"). A request that names the mark
of the last reply ("processes_since") gets only what changed since: "processes" holds the new
and changed entries, "processes_gone" the pids that are gone, and "processes_since" repeats the
mark. Any other mark, or none, gets every process. "processes": "stages" reads the table for
the stage states but sends (and looks for the sockets of) only the stages' processes.
"""

from __future__ import annotations

import base64
import binascii
import glob
import json
import os
import socket
import sys
import time
from typing import Any, Iterable, Mapping

from .death import cgroup_memory, memory_cgroup
from .disk import Listings, artifacts, disks, resolve, workspace_users
from .gpus import GpuSession, read_once
from .identity import same_start
from .logfiles import HeldLogs, TooBig, logs, ranges, read_regular, read_small
from .packages import check_request as check_packages_request
from .packages import environments
from .procfs import CLK_TCK, ChainMarkers, boot_id, boot_time, chain_pids, json_document, record_btime
from .procs import Facts, processes
from .request_cache import HeldRequest, HeldUnknown
from .serving import ServingReader, check_serving_request, start_reading
from .sockets import fd_links, listeners, watched_folder, writers
from .wire import (
    BinaryEntry,
    GpuSection,
    ListingReply,
    ListingSpec,
    MemoryReading,
    ProbeReply,
    ProbeRequest,
    ReportSpec,
    StageState,
)

MAX_REPORTS = 50
MAX_REPORT_BYTES = 64 * 1024
MAX_DEATH_BYTES = 16 * 1024  # a stage's STAGE.death (death.py)
CHAIN_MARKERS = ChainMarkers()  # kept by a --serve probe: a process's marker is read once


def binaries(workspace: str | None, paths: Iterable[str]) -> list[BinaryEntry]:
    """Each declared binary: does it exist, and may it be executed (the tar-prefix trap)? One
    named without a folder ("chromium") is looked for on the PATH, as a shell would."""
    out: list[BinaryEntry] = []
    for path in paths:
        if "/" not in path:
            import shutil  # only for a name on the PATH: the poll's start-up stays small

            found = shutil.which(path)
            out.append({"path": path, "exists": found is not None, "executable": found is not None})
            continue
        full = resolve(workspace, path)
        out.append({"path": path, "exists": os.path.exists(full), "executable": os.access(full, os.X_OK)})
    return out


# ---------------------------------------------------------------- reports


def reports(workspace: str | None, specs: Iterable[ReportSpec],
            errors: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Small files (eval summaries and the like) matching workspace globs, newest first: each
    read whole, or (over MAX_REPORT_BYTES) sent without its text, its size said."""
    out = []
    for spec in specs:
        paths = glob.glob(resolve(workspace, spec["glob"]))
        try:
            paths.sort(key=os.path.getmtime, reverse=True)
        except OSError:
            pass  # one vanished meanwhile; the order matters less than the reply
        for path in paths[: int(spec.get("max", MAX_REPORTS))]:
            try:
                mtime = os.path.getmtime(path)
                try:
                    data = read_small(path, MAX_REPORT_BYTES)  # a regular file only: a FIFO would block
                    text, size = data.decode("utf-8", "replace"), len(data)
                except TooBig as e:  # sent without its text, its size said: never a part read as if whole
                    text, size = "", e.size
                out.append({"glob": spec["glob"], "path": path, "mtime": mtime, "text": text,
                            "size": size, "limit": MAX_REPORT_BYTES})
            except OSError as e:
                errors.append({"what": path, "error": str(e)})
    return out


# ---------------------------------------------------------------- stage states


def stage_states(workspace: str, by_pid: Mapping[int, Mapping[str, Any]], btime: float,
                 errors: list[dict[str, str]]) -> list[StageState]:
    """Recorded stage launches under WORKSPACE/.samai/state, each with whether it still runs."""
    state_dir = os.path.join(workspace, ".samai", "state")
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as e:
        errors.append({"what": state_dir, "error": str(e)})
        return []
    out = []
    for name in names:
        path = os.path.join(state_dir, name)
        try:
            rec = json_document(read_small(path, MAX_REPORT_BYTES))  # TooBig, a ValueError, says its size
        except (OSError, ValueError) as e:
            errors.append({"what": path, "error": str(e)})
            continue
        problem = record_problem(rec)
        if problem:  # a file anyone could have written there: it costs its own entry, not the reply
            errors.append({"what": path, "error": problem})
            continue
        proc = by_pid.get(rec.get("pid"))
        # Its start as the record's boot time reads it (which a stepped clock may have moved).
        started = proc["start_time"] - btime + record_btime(rec, btime) if proc else None
        rec["alive"] = proc is not None and same_start(started, rec.get("start_time")) and proc["state"] != "Z"
        # Every process its chain started, in its group or not (a setsid child): procfs.chain_pids.
        rec["group"] = sorted(chain_pids(by_pid, rec, record_btime(rec, btime) - btime, CHAIN_MARKERS))
        rc_path = os.path.join(state_dir, name[: -len(".json")] + ".rc")
        try:
            rec["rc"] = int(read_small(rc_path, 64).strip())  # a longer file is no rc: never its first bytes
        except (OSError, ValueError):
            rec["rc"] = None
        if rec["rc"] is not None and not -(1 << 31) <= rec["rc"] < 1 << 31:
            rec["rc"] = None  # no exit status: what the trap wrote was overwritten
        if rec["rc"] is not None and rec["group"]:
            rec["alive"] = True  # its chain has finished, but processes it started still run
        rec["stopped_at"], rec["stopped_by"] = stop_note(os.path.join(state_dir, name[: -len(".json")] + ".stopped"),
                                                         rec)
        rec["death"] = death_said(os.path.join(state_dir, name[: -len(".json")] + ".death"), rec)
        out.append(rec)
    CHAIN_MARKERS.keep_only(by_pid)
    return out


def memory_limits() -> MemoryReading:
    """The box's RAM (/proc/meminfo) and the memory cgroup limit the probe runs under (its stages
    run under it too, unless they move): what a stage's memory is measured against."""
    out: MemoryReading = {}
    try:
        for line in read_regular("/proc/meminfo", 1 << 16).decode("ascii", "replace").splitlines():
            name, _, value = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                out["total" if name == "MemTotal" else "available"] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    found = memory_cgroup()
    if found is not None:
        limit = cgroup_memory(*found).get("limit")
        if limit:
            out.update({"cgroup": found[1][:300], "limit": limit})
    return out


def death_said(path: str, rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """Why this run died as its chain said it (death.py's STAGE.death), when it ended with an rc
    other than 0; None otherwise or when the file is not of that shape."""
    if rec.get("rc") in (None, 0):
        return None
    try:
        said = json_document(read_regular(path, MAX_DEATH_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(said, dict) or not isinstance(said.get("cause"), str) or not isinstance(said.get("detail"), str):
        return None
    evidence = said.get("evidence")
    evidence = [e[:400] for e in evidence[:8] if isinstance(e, str)] if isinstance(evidence, list) else []
    return {"cause": said["cause"][:40], "detail": said["detail"][:400], "evidence": evidence}


def stop_note(path: str, rec: Mapping[str, Any]) -> tuple[float | None, str]:
    """When the operator stopped this run and by whom (kill.py's STAGE.stopped naming the
    record's fired_at), else (None, ""): a stop of an earlier run says nothing about this one."""
    try:
        note = json_document(read_regular(path, 1024))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(note, dict) or note.get("fired_at") != rec.get("fired_at"):
        return None, ""
    when, by = note.get("time"), note.get("by")
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not 0 <= when < 1e11:
        return None, ""  # not a time this box's clock could have written
    return float(when), by[:120] if isinstance(by, str) else ""


# ---------------------------------------------------------------- the request's shape

MAX_ARTIFACT_BUDGET_S = 30.0  # a size walk longer than this is a bad request, not a slow disk
NUMBER = (int, float)
MAX_OFFSET = 2 ** 63 - 1  # what a file offset (off_t) can hold
MAX_INODE = 2 ** 64 - 1
PATH_KEYS = ("workspace", "path", "glob")


def check_request(req: Any) -> None:
    """Raise ValueError, naming the key, unless req has the shape the module docstring gives
    (numbers within what a file offset holds, paths without NUL characters): a malformed request
    gets one error reply rather than a traceback from deep in a read."""
    if not isinstance(req, dict):
        raise ValueError("request must be a JSON object")
    optional(req, "workspace", "request", str)
    optional(req, "processes_since", "request", str)
    scope = req.get("processes", True)
    if not (isinstance(scope, bool) or scope == "stages"):
        raise ValueError('request.processes must be true, false or "stages"')
    budget = optional(req, "artifact_budget_s", "request", NUMBER)
    if budget is not None and not 0 <= budget <= MAX_ARTIFACT_BUDGET_S:
        raise ValueError("request.artifact_budget_s must be between 0 and %g" % MAX_ARTIFACT_BUDGET_S)
    for where, spec in entries(req, "artifacts"):
        required(spec, "path", where, str)
        optional(spec, "name", where, str)
    for where, spec in entries(req, "logs"):
        check_log_request(spec, where)
    for where, spec in entries(req, "ranges"):
        required(spec, "path", where, str)
        required(spec, "start", where, int)
        required(spec, "end", where, int)
    for where, spec in entries(req, "reports"):
        required(spec, "glob", where, str)
        optional(spec, "max", where, int)
    users = req.get("users")
    if users is not None:
        if not isinstance(users, dict):
            raise ValueError("request.users must be an object")
        optional(users, "top", "request.users", int)
        budget = optional(users, "budget_s", "request.users", NUMBER)
        if budget is not None and not 0 <= budget <= MAX_ARTIFACT_BUDGET_S:
            raise ValueError("request.users.budget_s must be between 0 and %g" % MAX_ARTIFACT_BUDGET_S)
    check_listing_request(req)
    if req.get("packages") is not None:
        check_packages_request(req["packages"])
    if req.get("gpus") is not None and not isinstance(req["gpus"], bool):
        raise ValueError("request.gpus must be true or false")
    if req.get("serving") is not None:
        check_serving_request(req["serving"])
    binaries = req.get("binaries")
    if binaries is not None and not (isinstance(binaries, list) and all(isinstance(b, str) for b in binaries)):
        raise ValueError("request.binaries must be a list of paths")
    if binaries and not all(is_file_name(b) for b in binaries):
        raise ValueError("request.binaries holds what is not a file name")


def check_log_request(spec: Mapping[str, Any], where: str) -> None:
    required(spec, "path", where, str)
    for key in ("offset", "inode", "dev", "scan_from", "last_lines", "max_bytes"):
        optional(spec, key, where, int)
    optional(spec, "mtime", where, NUMBER)
    optional(spec, "check", where, str)
    for at, marker in entries(spec, "markers", where):
        required(marker, "name", at, str)
        optional(marker, "pattern", at, str)
        needles = marker.get("needles")
        if needles is not None and not (isinstance(needles, list) and all(isinstance(n, str) for n in needles)):
            raise ValueError("%s.needles must be a list of strings" % at)


MAX_LISTING = 1000  # names sent back: more than anyone reads under a path being typed
MAX_SCANNED = 1000000  # entries read of one folder for them: a second or two at most


def check_listing_request(req: Mapping[str, Any]) -> None:
    listing_spec = req.get("listing")
    if listing_spec is not None:
        if not isinstance(listing_spec, dict):
            raise ValueError("request.listing must be an object")
        required(listing_spec, "path", "request.listing", str)
        optional(listing_spec, "max", "request.listing", int)
        optional(listing_spec, "prefix", "request.listing", str)


def listing(workspace: str | None, spec: ListingSpec) -> ListingReply:
    """One folder's entry names that start with spec["prefix"], folders ending in "/" (the
    console completes a typed path from them): at most spec["max"] of them, dot files only when
    the prefix starts with a dot (as shells complete). "complete" says whether that was all of
    them: a folder of a million files is read to its end (up to MAX_SCANNED entries), so the one
    name typed so far is found wherever it stands."""
    path = resolve(workspace, spec["path"])
    limit = min(int(spec.get("max") or MAX_LISTING), MAX_LISTING)
    prefix = spec.get("prefix") or ""
    hidden = prefix.startswith(".")
    names: list[str] = []
    try:
        with os.scandir(path) as found:
            for scanned, entry in enumerate(found):
                if scanned >= MAX_SCANNED:
                    return {"path": path, "entries": names, "complete": False}
                if not entry.name.startswith(prefix) or (entry.name.startswith(".") and not hidden):
                    continue
                if len(names) >= limit:
                    return {"path": path, "entries": names, "complete": False}
                names.append(entry.name + ("/" if entry.is_dir() else ""))
    except OSError as e:
        return {"path": path, "error": str(e)}
    return {"path": path, "entries": names, "complete": True}


def entries(spec: Mapping[str, Any], key: str, where: str = "request") -> list[tuple[str, dict[str, Any]]]:
    """(where, entry) for each object in the list spec[key] (absent or null: none)."""
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError("%s.%s must be a list of objects" % (where, key))
    return [("%s.%s[%d]" % (where, key, i), v) for i, v in enumerate(value)]


def required(spec: Mapping[str, Any], key: str, where: str, types: type | tuple[type, ...]) -> Any:
    if key not in spec:
        raise ValueError("%s has no %s" % (where, key))
    return optional(spec, key, where, types)


def optional(spec: Mapping[str, Any], key: str, where: str, types: type | tuple[type, ...]) -> Any:
    """spec[key] when it is null, absent or one of types (never a bool for a number)."""
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError("%s.%s must be %s, not %s" % (where, key, type_name(types), type(value).__name__))
    if isinstance(value, float) and value != value:
        raise ValueError("%s.%s must be a number, not NaN" % (where, key))
    if key in PATH_KEYS and isinstance(value, str) and not is_file_name(value):  # a path key's type is str
        raise ValueError("%s.%s is not a file name (a NUL, or a character the file system cannot hold)"
                         % (where, key))
    if isinstance(value, int) and not 0 <= value <= (MAX_INODE if key in ("inode", "dev") else MAX_OFFSET):
        raise ValueError("%s.%s is out of range" % (where, key))
    return value


def is_file_name(text: str) -> bool:
    """Whether the system calls can take text as a path: no NUL, and encodable (a name read from
    the box that is not UTF-8 comes back as surrogate escapes, which encode to its bytes)."""
    if "\0" in text:
        return False
    try:
        os.fsencode(text)
    except UnicodeError:
        return False
    return True


def type_name(types: type | tuple[type, ...]) -> str:
    names: dict[object, str] = {str: "a string", int: "an integer"}
    return names.get(types, "a number")


RECORD_FIELDS = (("stage", (str,)), ("pid", (int,)), ("pgid", (int,)), ("log", (str,)), ("cmd", (str,)),
                 ("fired_at", NUMBER))
RECORD_OPTIONAL = (("start_time", NUMBER), ("boot_time", NUMBER), ("boot_id", (str,)))


def record_problem(rec: Any) -> str | None:
    """What makes rec not a stage record as launch.py writes one; None when it is one."""
    if not isinstance(rec, dict):
        return "not a stage record: %s" % type(rec).__name__
    for key, types in RECORD_FIELDS + RECORD_OPTIONAL:
        value = rec.get(key)
        if value is None and (key, types) in RECORD_OPTIONAL:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            return "not a stage record: %s is %s" % (key, type(value).__name__)
        # NaN and inf fail this too; an integer of a thousand digits is no pid either
        if isinstance(value, (int, float)) and not -1e18 < value < 1e18:
            return "not a stage record: %s is %.40r" % (key, value)
    return None


# ---------------------------------------------------------------- main


class Memory(object):
    """What a --serve probe keeps from one request to the next, to answer the next one with
    fewer reads: only what it can tell still holds, so that an answer is a fresh probe's (the
    limits of "can tell" are in Facts and fd_links)."""

    def __init__(self) -> None:
        self.facts = Facts()
        self.listings = Listings()
        self.logs = HeldLogs()  # the followed logs' descriptors: a rotated one is read to its end
        self.session = binascii.hexlify(os.urandom(8)).decode()  # no other probe's marks match
        self.replies = 0
        self.sent: dict[int, dict[str, Any]] = {}  # pid -> the entry the last marked reply gave for it
        self.mark: str | None = None  # of that reply
        self.held = HeldRequest()  # the last request, which the next one may name as its base
        self.gpus = GpuSession()  # NVML, initialised on the first request for GPUs, not per poll
        self.serving = ServingReader()  # the serving endpoints' requests, some in flight across polls


def process_reply(reply: ProbeReply, procs: list[dict[str, Any]], since: Any, memory: Memory | None) -> None:
    """Fill in the reply's processes: all of them, or (to a request that holds the last reply's
    processes) what changed since. An entry unchanged since is the very object given then."""
    if memory is None:
        reply["processes"] = procs
        return
    sent = memory.sent
    if since is not None and since == memory.mark:
        reply["processes"] = [p for p in procs if sent.get(p["pid"]) is not p and sent.get(p["pid"]) != p]
        live = set(p["pid"] for p in procs)
        reply["processes_gone"] = [pid for pid in sent if pid not in live]
        reply["processes_since"] = since
    else:
        reply["processes"] = procs
    memory.replies += 1
    memory.mark = reply["processes_mark"] = "%s.%d" % (memory.session, memory.replies)
    memory.sent = dict((p["pid"], p) for p in procs)


def stage_processes(procs: list[dict[str, Any]], pids: list[int],
                    states: list[StageState]) -> tuple[list[dict[str, Any]], list[int]]:
    """The entries and user pids of the processes that belong to a recorded stage's chain."""
    ours = set(pid for rec in states for pid in rec["group"])  # the chain's leader is in its group
    return [p for p in procs if p["pid"] in ours], [pid for pid in pids if pid in ours]


def probe(req: ProbeRequest, memory: Memory | None = None) -> ProbeReply:
    errors: list[dict[str, str]] = []
    btime = boot_time()
    workspace: str | None = req.get("workspace")
    if workspace:
        workspace = os.path.expanduser(workspace)
    reply: ProbeReply = {
        "time": time.time(),
        "boot_time": btime,
        "boot_id": boot_id(),  # with boot_time: what a start time here is read against (kill.py)
        "clk_tck": CLK_TCK,
        "host": socket.gethostname(),
        "probe_pid": os.getpid(),
        "errors": errors,
    }
    serving = None
    if req.get("serving"):  # a --serve probe's reader never waits twice on a stuck server
        spec = req["serving"]
        serving = memory.serving.begin(spec) if memory is not None else start_reading(spec)
    reply["disks"] = disks(workspace, errors)
    facts = memory.facts if memory else None
    reply["artifacts"] = artifacts(workspace, req.get("artifacts") or (), float(req.get("artifact_budget_s", 1.0)),
                                   memory.listings if memory else None)
    # "stages": the table is read for the stage states, but only the stages' processes are sent
    # (and looked at for sockets): a fleet row's share, not the box screen's whole table.
    scope = req.get("processes", True)
    procs, pids = processes(btime, errors, facts) if scope else ([], [])
    by_pid = dict((p["pid"], p) for p in procs)
    states = stage_states(workspace, by_pid, btime, errors) if workspace and req.get("states", True) else []
    if scope == "stages":
        procs, pids = stage_processes(procs, pids, states)
    if scope:
        process_reply(reply, procs, req.get("processes_since"), memory)
    else:
        reply["processes"] = procs
    # One walk of every open descriptor serves both writers and listeners; listeners alone
    # read only as many as it takes to find each listening socket's owner.
    pids = [pid for pid in pids if pid != reply["probe_pid"]]  # its own descriptors: /proc files
    links = list(fd_links(pids, facts, watched_folder(workspace))) if workspace and req.get("writers") else None
    reply["listeners"] = listeners(pids, errors, links, facts) if procs else []
    reply["writers"] = writers(workspace, links) if links is not None and workspace else {}  # links: with a workspace
    reply["binaries"] = binaries(workspace, req.get("binaries") or ())
    users = req.get("users")
    if users is not None and workspace:
        try:
            reply["users"] = workspace_users(workspace, max(0, int(users.get("top", 10))),
                                             float(users.get("budget_s", 2.0)), memory.listings if memory else None)
        except OSError as e:
            errors.append({"what": "users " + workspace, "error": str(e)})
    if req.get("listing") is not None:
        reply["listing"] = listing(workspace, req["listing"])
    if req.get("packages") is not None:
        reply["packages"] = environments(workspace, req["packages"])
    reply["logs"] = logs(req.get("logs") or (), memory.logs if memory else None)
    reply["ranges"] = ranges(req.get("ranges") or ())
    reply["reports"] = reports(workspace, req.get("reports") or (), errors)
    reply["states"] = states
    if scope:
        reply["memory"] = memory_limits()
    if req.get("gpus", True):
        reply.update(gpu_section(memory))
    if serving is not None:
        reply["serving"] = serving()
    return reply


def gpu_section(memory: Memory | None) -> GpuSection:
    """The GPU keys of the reply. The session answers any NVML failure itself; a bug in reading
    one costs the GPU section, not the reply."""
    try:
        return memory.gpus.read() if memory is not None else read_once()
    except Exception as e:
        return {"gpus": [], "gpu_error": "reading the GPUs failed: %s: %s" % (type(e).__name__, str(e)[:200])}


def answer(text: str, memory: Memory | None = None) -> bytes:
    """The reply to one request line: JSON on one line and, when the request asks to "attach"
    the bytes it reads, a line end and those bytes, which its entries' "data_at" [start, length]
    point into (raw bytes cost a third less than base64, and no encoding on either side).
    A request it cannot read gets an error reply."""
    blobs: list[bytes] = []
    reply: ProbeReply
    try:
        req = json.loads(text or "{}")
        if memory is not None:
            req = memory.held.expand(req)
        check_request(req)
        reply = probe(req, memory)
        if memory is not None:
            reply["held"] = memory.held.keep(req)
        pack_data(reply, blobs if req.get("attach") else None)
    except HeldUnknown as e:
        reply = {"error": str(e), "held_unknown": True}
    except Exception as e:  # a request it cannot serve, or a bug: said, and the probe serves on
        reply = {"error": "%s: %s" % (type(e).__name__, e)}
    line = json.dumps(reply, separators=(",", ":")).encode("utf-8")  # ASCII: no line end inside
    return line + b"\n" + b"".join(blobs) if blobs else line


def pack_data(reply: ProbeReply, blobs: list[bytes] | None) -> None:
    """The bytes read into each log and range entry: base64 in the JSON, or (blobs given) appended
    to blobs, the entry pointing at them."""
    at = 0  # from the first byte after the JSON's line end
    for entry in reply.get("logs", []) + reply.get("ranges", []):
        data = entry.get("data")
        if data is None:
            continue
        if blobs is None:
            entry["data"] = base64.b64encode(data).decode("ascii")
            continue
        del entry["data"]
        entry["data_at"] = [at, len(data)]
        blobs.append(bytes(data))
        at += len(data)


def serve() -> int:
    """One request per line on stdin, each answered with a length line and the reply, until
    stdin closes: the console keeps one probe running per connection instead of starting one
    per poll. The length lets the reader take a reply of megabytes without scanning for a
    line end."""
    out = sys.stdout.buffer
    memory = Memory()
    for line in sys.stdin.buffer:
        reply = answer(line.decode("utf-8", "replace"), memory)
        out.write(b"%d\n" % len(reply))
        out.write(reply)
        out.flush()
        memory.serving.after_reply()
    memory.gpus.close()
    return 0


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    sys.stdout.buffer.write(answer(sys.stdin.buffer.read().decode("utf-8", "replace")) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
