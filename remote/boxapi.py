"""The Box: the pipeline box as the console sees it, built once on any Transport.

Every call is one round trip: a box tool run with a JSON request on stdin, or one request to
the probe the Box keeps running. The tools live in WORKSPACE/.samai/tools/<hash>/, installed
the first time a Box needs them and again only when their content (and so the hash) changes;
they run as `python3 -S FOLDER TOOL` (see boxtools.py for the layout). The probe starts through
STARTER, which installs them on the way when they are missing (the archive goes ahead of the
second request): a fresh box costs one round trip more than a box that has them. The install
(install.py) writes only inside the workspace (see box/confine.py).

Requests to a running probe are sent as changes to the last one (held.py), and the bytes of
logs and ranges come back raw after the reply's JSON rather than base64 inside it.

A read-only Box writes nothing on the box, not even the workspace: its probe runs by LOADER
from stdin (its code sent ahead of the first request), and it refuses every tool that changes
the box (launch, kill, clean) by itself, whatever the layers above it allow.

Each request is built as its tool's request type and each reply taken as its reply type
(box/wire.py, which the tools import too), so that the type checker sees a key renamed on either
side; the reply's values are checked where they are read (model.py).
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from samai.remote import model
from samai.remote.box.wire import (
    CheckpointsReply,
    CheckpointsRequest,
    CleanReply,
    CleanRequest,
    GgufRequest,
    GgufWriteReply,
    KillReply,
    KillRequest,
    LaunchReply,
    LaunchRequest,
    LogSpec,
    ProbeReply,
    ProbeRequest,
    Tool,
    WatchersReply,
    WatchersRequest,
)
from samai.remote.boxtools import LOADER, STARTER, ToolSet, module_of
from samai.remote.boxtools import tool_names as tool_names  # re-exported: the Box's callers list the tools here
from samai.remote.follow import LogCursor
from samai.remote.model import Boot, BoxError, CleanResult, FireResult, LogChunk, SignalResult, Snapshot
from samai.remote.request_delta import HeldRequest
from samai.remote.transport import Stream, Transport

READY = ".ready"
GGUF_TOOL = Tool.GGUF_SURGERY
GGUF_WRITE = f"{Tool.GGUF_SURGERY} (set_kv, add_tensors, extract)"  # its show and plans only read
WRITING_TOOLS = (Tool.LAUNCH, Tool.KILL, Tool.CLEAN, Tool.INSTALL, GGUF_WRITE, Tool.WATCHERS)
SERVING_BUDGET_S = 0.8  # all serving ports' answers, asked at once: a stopped server costs this, no more

Req = TypeVar("Req", bound=Mapping[str, object])
Rep = TypeVar("Rep", bound=Mapping[str, object])


@dataclass(frozen=True)
class ToolCall(Generic[Req, Rep]):
    """A box tool with the types of its request and reply (box/wire.py): Box._run takes only that
    request for it, and hands back its reply as that type."""

    tool: str


LAUNCH = ToolCall[LaunchRequest, LaunchReply](Tool.LAUNCH)
KILL = ToolCall[KillRequest, KillReply](Tool.KILL)
CLEAN = ToolCall[CleanRequest, CleanReply](Tool.CLEAN)
CHECKPOINTS = ToolCall[CheckpointsRequest, CheckpointsReply](Tool.CHECKPOINTS)
WATCHERS = ToolCall[WatchersRequest, WatchersReply](Tool.WATCHERS)
GGUF_SHOW = ToolCall[GgufRequest, dict[str, Any]](Tool.GGUF_SURGERY)  # the header: read by model.gguf_header
GGUF_SURGERY = ToolCall[GgufRequest, GgufWriteReply](Tool.GGUF_SURGERY)


class Box:
    def __init__(self, transport: Transport, workspace: str, *, python: str = "python3",
                 timeout: float = 30.0, tools: ToolSet | None = None, readonly: bool = False) -> None:
        self.transport = transport
        self.workspace = workspace
        self.readonly = readonly
        self.python = python
        self.timeout = timeout
        self.tools = tools or ToolSet.bundled()
        self.tools_dir = posixpath.join(workspace, ".samai", "tools", self.tools.digest)
        self._tools_checked: int | None = None  # the transport generation the tools were checked in
        self._probe: Stream | None = None  # one probe kept running: polls pay no process start
        self._probe_lock = asyncio.Lock()
        self._probe_generation = 0
        self._processes = HeldProcesses()
        self._held = HeldRequest()
        self._converted = model.ProcessCache()  # what snapshot() made of the processes _processes holds
        self.last_request_bytes = 0  # the last request line sent to the probe (a steady poll fits one packet)

    # ------------------------------------------------------------ plumbing

    async def ensure_tools(self) -> None:
        """Install the tools unless this connection has already seen them (by their hash)."""
        self._refuse_in_readonly(Tool.INSTALL)
        if self._tools_checked == self.transport.generation:
            return
        marker = posixpath.join(self.tools_dir, READY)
        probe = await self.transport.run(["test", "-f", marker], timeout=self.timeout, retry_safe=True)
        if probe.rc != 0:
            await self._install()
        self._tools_checked = self.transport.generation

    async def _install(self) -> None:
        stdin = self.tools.loader_for(Tool.INSTALL) + self.tools.archive()
        result = await self.transport.run(self._loader_argv(Tool.INSTALL, self.workspace, self.tools.digest),
                                          stdin=stdin, timeout=self.timeout + 30)
        if result.rc != 0:
            raise BoxError(f"{Tool.INSTALL} failed (rc={result.rc}): {result.stderr_text()[-500:]}")
        _reply(Tool.INSTALL, result.stdout)

    def _refuse_in_readonly(self, tool: str) -> None:
        if self.readonly and tool in WRITING_TOOLS:
            raise BoxError(f"{tool} refused: the console is read-only and writes nothing on the box")

    def _argv(self, tool: str, *args: str) -> list[str]:
        # -S: the tools need only the standard library, and skipping site halves the start-up.
        return [self.python, "-S", self.tools_dir, module_of(tool), *args]

    def _loader_argv(self, tool: str, *args: str) -> list[str]:
        return [self.python, "-S", "-c", LOADER, module_of(tool), *args]

    async def call(self, tool: str, request: Mapping[str, Any], *, timeout: float | None = None) -> dict:
        """Run one tool for one request."""
        self._refuse_in_readonly(tool)
        await self.ensure_tools()
        result = await self.transport.run(self._argv(tool), stdin=json.dumps(request).encode(),
                                          timeout=timeout or self.timeout)
        if result.rc != 0:
            if result.rc == 127 or b"No such file" in result.stderr or b"can't find '__main__'" in result.stderr:
                self._tools_checked = None  # someone removed them: upload again next call
            raise BoxError(f"{tool} failed (rc={result.rc}): {result.stderr_text()[-500:]}")
        return _reply(tool, result.stdout)

    async def call_readonly(self, tool: str, request: Mapping[str, Any], *, timeout: float | None = None) -> dict:
        """Run a tool that only reads: from its installed copy, or, read-only, with its code sent
        on stdin ahead of the request (nothing installed, nothing written)."""
        if not self.readonly:
            return await self.call(tool, request, timeout=timeout)
        stdin = self.tools.loader_for(tool) + json.dumps(request).encode()
        result = await self.transport.run(self._loader_argv(tool), stdin=stdin, timeout=timeout or self.timeout)
        if result.rc != 0:
            raise BoxError(f"{tool} failed (rc={result.rc}): {result.stderr_text()[-500:]}")
        return _reply(tool, result.stdout)

    async def _run(self, call: ToolCall[Req, Rep], request: Req, *, reads_only: bool = False,
                   timeout: float | None = None) -> Rep:
        """call's tool for its own request type; its reply as the tool declares it (box/wire.py):
        a promise of the tool's code, not of the bytes that came back, so every value is still
        checked where it is read (model.py). reads_only: as call_readonly."""
        run = self.call_readonly if reads_only else self.call
        return cast(Rep, await run(call.tool, request, timeout=timeout))

    async def ask_probe(self, request: ProbeRequest, *, timeout: float | None = None) -> ProbeReply:
        """One request to the running probe (started on first use, and again after a failure)."""
        async with self._probe_lock:
            if self._probe is not None and self._probe_generation != self.transport.generation:
                await self._probe.close()  # it lived on a connection that is gone
                self._probe = None
            if self._probe is None:
                self._probe = await self._open_probe()
                self._probe_generation = self.transport.generation
                self._processes, self._held = HeldProcesses(), HeldRequest()
            try:
                reply = await self._ask(self._probe, {**self._processes.ask(request), "attach": True},
                                        timeout or self.timeout)
            except BaseException:  # a failure, a deadline, or our caller giving up (cancellation)
                stream, self._probe = self._probe, None
                await asyncio.shield(stream.close())  # a half-answered probe is never asked again
                raise
            return self._processes.fold(cast(ProbeReply, _checked(Tool.PROBE, reply)))  # checked as read: model.py

    async def _ask(self, stream: Stream, request: ProbeRequest, timeout: float) -> dict[str, Any]:
        """The probe's reply to request, sent as changes to the last one where the probe holds
        it, and again whole when it does not; the tools' archive goes ahead of it when the
        starter found no tools."""
        whole = json.dumps(request).encode()
        line = json.dumps(self._held.compact(request)).encode() if stream.persistent else whole
        self.last_request_bytes = len(line)
        reply = _unpack(Tool.PROBE, await stream.request(line, timeout=timeout))
        if reply.get("held_unknown"):
            reply = _unpack(Tool.PROBE, await stream.request(whole, timeout=timeout))
        if reply.get("tools_missing") and not self.readonly:
            reply = _unpack(Tool.PROBE, await stream.request(self.tools.archive() + whole, timeout=timeout + 30))
        self._held.answered(request, reply.get("held"))
        if "error" not in reply and not self.readonly:
            self._tools_checked = self.transport.generation  # the starter ran the probe from them
        return reply

    async def _open_probe(self) -> Stream:
        if self.readonly:  # nothing installed: the probe's code goes ahead of its first request
            return await self.transport.open_stream(self._loader_argv(Tool.PROBE, "--serve"),
                                                    preamble=self.tools.loader_for(Tool.PROBE))
        return await self.transport.open_stream([self.python, "-S", "-c", STARTER, self.tools_dir,
                                                 module_of(Tool.PROBE), "--serve"])

    # ------------------------------------------------------------ reads

    async def snapshot(self, *, artifacts: Sequence[tuple[str, str]] = (), logs: Sequence[LogCursor] = (),
                       reports: Sequence[str] = (), processes: bool | Literal["stages"] = True, writers: bool = False,
                       binaries: Sequence[str] = (), artifact_budget_s: float = 1.0,
                       serving: Sequence[int] = (), props: Sequence[int] | None = None,
                       canary: Sequence[int] = ()) -> Snapshot:
        """Disk, artifact sizes, processes, listeners, new log bytes, report files and stage
        states, and the serving ports' monitoring answers when asked: one call. props: the serving
        ports also asked /props (None: all of them)."""
        started = time.monotonic()
        raw = await self.ask_probe(self.snapshot_request(
            artifacts=artifacts, logs=logs, reports=reports, processes=processes, writers=writers,
            binaries=binaries, artifact_budget_s=artifact_budget_s, serving=serving, props=props, canary=canary))
        snap = model.snapshot(raw, time.monotonic() - started, self._converted)
        if len(snap.logs) != len(logs):  # each entry answers the cursor in its place: none may be missing
            raise BoxError(f"malformed reply: {len(snap.logs)} log entries for the {len(logs)} logs asked")
        return snap

    def snapshot_request(self, *, artifacts: Sequence[tuple[str, str]] = (), logs: Sequence[LogCursor] = (),
                         reports: Sequence[str] = (), processes: bool | Literal["stages"] = True, writers: bool = False,
                         binaries: Sequence[str] = (), artifact_budget_s: float = 1.0,
                         serving: Sequence[int] = (), props: Sequence[int] | None = None,
                         canary: Sequence[int] = ()) -> ProbeRequest:
        """The probe request behind snapshot()."""
        request: ProbeRequest = {
            "workspace": self.workspace,
            "artifacts": [{"name": name, "path": path} for name, path in artifacts],
            "artifact_budget_s": artifact_budget_s,
            "logs": [_log_spec(c) for c in logs],
            "reports": [{"glob": g} for g in reports],
            "processes": processes,
            "writers": writers,
            "binaries": list(binaries),
        }
        if serving:  # within a budget well inside the Box's own deadline: a stuck server never costs the poll
            request["serving"] = {"ports": list(serving), "budget_s": SERVING_BUDGET_S,
                                  "props": list(serving if props is None else props),
                                  **({"canary": list(canary)} if canary else {})}
        return request

    async def disk_users(self, top: int = 10, budget_s: float = 2.0) -> model.DiskUsers:
        """The workspace's largest entries, two levels down, biggest first."""
        request: ProbeRequest = {"workspace": self.workspace, "users": {"top": top, "budget_s": budget_s},
                                 "processes": False, "states": False}
        return model.disk_users(await self.ask_probe(request))

    async def list_dir(self, path: str, prefix: str = "", limit: int = 1000) -> model.Listing:
        """The names in a folder on the box (relative: in the workspace) that start with prefix,
        folders ending in "/"; BoxError when it cannot be listed. Names that are not text are left
        out (no one types them)."""
        request: ProbeRequest = {"workspace": self.workspace, "listing": {"path": path, "prefix": prefix, "max": limit},
                                 "processes": False, "states": False}
        got = (await self.ask_probe(request)).get("listing")
        if not isinstance(got, dict):
            raise BoxError("malformed reply: no listing")
        if got.get("error") is not None:
            raise BoxError(f"{path}: {str(got['error'])[:300]}")
        names = got.get("entries")
        if not isinstance(names, list):
            raise BoxError("malformed reply: listing.entries is not a list")
        return model.Listing(tuple(n for n in names if isinstance(n, str) and n and _is_text(n)),
                             got.get("complete") is not False)

    async def python_packages(self, pythons: Sequence[str], names: Sequence[str] = ()
                              ) -> tuple[model.PythonPackages, ...]:
        """The distributions installed beside each Python (relative: in the workspace), read from
        its site-packages without starting it; only those named, when names are given."""
        request: ProbeRequest = {"workspace": self.workspace, "processes": False, "states": False,
                                 "packages": [{"python": p, "names": list(names)} for p in pythons]}
        return model.python_packages(await self.ask_probe(request))

    async def checkpoints(self, folder: str, *, weights: bool = True) -> model.Checkpoints:
        """A training run's checkpoint-STEP folders under `folder` (in the workspace), newest
        first, each judged whole and finite by the box (box/checkpoints.py). weights=False: their
        sizes and completeness only (finite None), without reading the adapters."""
        request: CheckpointsRequest = {"workspace": self.workspace, "folder": folder, "weights": weights}
        return model.checkpoints(await self._run(CHECKPOINTS, request, reads_only=True))

    async def watchers(self) -> model.WatchShared:
        """Who watches this box, who leads, what was sent and acknowledged (box/watchers.py): read only."""
        request: WatchersRequest = {"workspace": self.workspace, "op": "read"}
        return model.watch_shared(await self._run(WATCHERS, request, reads_only=True))

    async def watch_beat(self, watcher: str, heartbeat: Mapping[str, Any], lease_s: float,
                         ledger: Mapping[str, Any] | None, *, release: bool = False) -> model.WatchShared:
        """A watcher's heartbeat; it takes or renews the lease to send when free, and the leader's
        ledger is kept (release: its last beat, the lease left free). Refused read-only (it
        writes in the workspace's .samai)."""
        request: WatchersRequest = {
            "workspace": self.workspace, "op": "beat", "id": watcher, "heartbeat": dict(heartbeat), "lease_s": lease_s,
            "ledger": dict(ledger) if ledger is not None else None, "release": release}
        return model.watch_shared(await self._run(WATCHERS, request))

    async def acknowledge(self, keys: Sequence[str], by: str, texts: Mapping[str, str]) -> model.WatchShared:
        """Alerts acknowledged: no watcher of this box repeats them."""
        request: WatchersRequest = {"workspace": self.workspace, "op": "ack", "keys": list(keys), "by": by,
                                    "text": dict(texts)}
        return model.watch_shared(await self._run(WATCHERS, request))

    async def read_log(self, cursor: LogCursor) -> LogChunk:
        request: ProbeRequest = {"logs": [_log_spec(cursor)], "processes": False, "states": False}
        raw = await self.ask_probe(request)
        return model.log_chunk(model.only_entry(raw, "logs"))

    async def tail(self, path: str, offset: int | None = None, **cursor: Any) -> LogChunk:
        """New bytes of one log from offset (None: the last `last_lines` lines)."""
        return await self.read_log(LogCursor(path, offset, **cursor))

    async def file_size(self, path: str) -> int:
        """The size of a file on the box (BoxError if it cannot be read)."""
        request: ProbeRequest = {"ranges": [{"path": path, "start": 0, "end": 0}], "processes": False, "states": False}
        got = model.byte_range(model.only_entry(await self.ask_probe(request), "ranges"))
        if got.error is not None:
            raise BoxError(f"{path}: {got.error}")
        return got.size

    async def head(self, path: str, size: int) -> bytes:
        """A file's first `size` bytes, or all of it when it is shorter (BoxError if it cannot be read)."""
        request: ProbeRequest = {"ranges": [{"path": path, "start": 0, "end": max(size, 1) - 1}],
                                 "processes": False, "states": False}
        got = model.byte_range(model.only_entry(await self.ask_probe(request), "ranges"))
        if got.error is not None:
            raise BoxError(f"read the start of {path}: {got.error}")
        return got.data[:size]

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes start..end inclusive; fails unless the file really holds all of them."""
        request: ProbeRequest = {"ranges": [{"path": path, "start": start, "end": end}], "processes": False,
                                 "states": False}
        got = model.byte_range(model.only_entry(await self.ask_probe(request), "ranges"))
        if got.error is not None:
            raise BoxError(f"read {path} [{start}-{end}]: {got.error}")
        if len(got.data) != end - start + 1:
            raise BoxError(f"read {path} [{start}-{end}]: got {len(got.data)} bytes, file is {got.size} bytes")
        return got.data

    async def gguf_show(self, path: str, *, timeout: float | None = None,
                        redirect_hosts: Sequence[str] = ()) -> model.GgufHeader:
        """A GGUF file's header, KVs and tensor table (bounded), with the checker's problems;
        reads only the header, even of a multi-GB file (a URL redirects to redirect_hosts too)."""
        request: GgufRequest = {"op": "show", "workspace": self.workspace, "path": path,
                                "redirect_hosts": list(redirect_hosts)}
        return model.gguf_header(await self._run(GGUF_SHOW, request, reads_only=True, timeout=timeout))

    async def gguf_plan(self, request: Mapping[str, Any], *, timeout: float | None = None) -> model.GgufWriteResult:
        """What a set_kv, add_tensors or extract would write (its size, the tensors it adds),
        with nothing written: the donor's header is read, never its tensors. request: the
        operator's (the action layer checks it first), a GgufRequest but for its workspace."""
        planned = _gguf_request(request, self.workspace, plan=True)
        return model.gguf_write_result(await self._run(GGUF_SURGERY, planned, reads_only=True, timeout=timeout))

    # ------------------------------------------------------------ actions (called by the action layer)

    async def gguf_write(self, request: Mapping[str, Any], timeout: float) -> model.GgufWriteResult:
        """Run a set_kv, add_tensors or extract: OUT.part written, asserted, then renamed."""
        self._refuse_in_readonly(GGUF_WRITE)
        written = _gguf_request(request, self.workspace, plan=False)
        return model.gguf_write_result(await self._run(GGUF_SURGERY, written, timeout=timeout))

    async def fire(self, stage: str, command: str, log: str, *, env: Mapping[str, str] | None = None,
                   verify_s: float = 3.0) -> FireResult:
        request: LaunchRequest = {"stage": stage, "workspace": self.workspace, "command": command, "log": log,
                                  "env": dict(env or {}), "verify_s": verify_s}
        return model.fire_result(await self._run(LAUNCH, request, timeout=self.timeout + verify_s), stage)

    async def stop(self, stage: str, *, signal: str = "TERM", grace: float = 10.0,
                   protect: Sequence[int] = (), by: str = "") -> SignalResult:
        """Signal every process the stage's chain started (its group, and any that left it for
        a session of its own); what outlives SIGKILL comes back as the result's survivors. by:
        who stops it (kept on the box with the stop: the run's cause of death names them)."""
        request: KillRequest = {"stage": stage, "workspace": self.workspace, "signal": signal, "grace": grace,
                                "protect": list(protect), "by": by}
        return model.signal_result(await self._run(KILL, request, timeout=self.timeout + grace))

    async def kill(self, pid: int, start_time: float, *, boot: Boot | None = None, signal: str = "TERM",
                   grace: float = 5.0, protect: Sequence[int] = (), group: bool = False) -> SignalResult:
        """Signal pid if it is the process that started at start_time (as read on `boot`: the
        boot of the snapshot it came from; without it, the box's boot time now): that process
        alone, or with group its whole process group. Its children and group that are left
        running come back as the result's remaining."""
        request: KillRequest = {"pid": pid, "start_time": start_time, "signal": signal, "grace": grace,
                                "protect": list(protect), "group": bool(group)}
        if boot is not None:
            request["boot_time"], request["boot_id"] = boot.time, boot.id
        return model.signal_result(await self._run(KILL, request, timeout=self.timeout + grace))

    async def remove(self, paths: Sequence[str]) -> CleanResult:
        """Delete workspace paths; anything that resolves outside the workspace is refused."""
        request: CleanRequest = {"workspace": self.workspace, "paths": list(paths)}
        return model.clean_result(await self._run(CLEAN, request))

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.close()
            self._probe = None
        await self.transport.close()


class HeldProcesses:
    """The processes of the running probe's last reply, so that the next request asks only for
    what changed since (see probe.py) and its reply is made whole again here."""

    def __init__(self) -> None:
        self.by_pid: dict[int, dict] = {}
        self.mark: str | None = None

    def ask(self, request: ProbeRequest) -> ProbeRequest:
        if self.mark is None or not request.get("processes", True):
            return request
        return {**request, "processes_since": self.mark}

    def fold(self, reply: ProbeReply) -> ProbeReply:
        """The reply with every process in "processes", in pid order."""
        model.check_process_delta(reply)
        mark = reply.pop("processes_mark", None)
        if mark is None:  # no processes asked, or a probe that marks nothing: all or none given
            return reply
        since = reply.pop("processes_since", None)
        if since is None:
            self.by_pid = {p["pid"]: p for p in reply["processes"]}
        elif since == self.mark:
            for pid in reply.pop("processes_gone", None) or ():  # None: the probe saw none go
                self.by_pid.pop(pid, None)
            changed = {p["pid"]: p for p in reply["processes"]}
            new = changed.keys() - self.by_pid.keys()
            self.by_pid.update(changed)
            if new:
                self.by_pid = dict(sorted(self.by_pid.items()))
        else:
            expected, self.by_pid, self.mark = self.mark, {}, None  # the next reply: every process
            raise BoxError(f"{Tool.PROBE} answered changes since {since}, not since {expected}")
        self.mark = mark
        reply["processes"] = list(self.by_pid.values())
        return reply


def _log_spec(cursor: LogCursor) -> LogSpec:
    """A log's entry of a probe request: the cursor's own (follow.py builds it; tests/test_wire.py
    holds its keys to LogSpec's)."""
    return cast(LogSpec, cursor.request())


def _gguf_request(request: Mapping[str, Any], workspace: str, *, plan: bool) -> GgufRequest:
    """The operator's GGUF request for this workspace, planned or written (the box checks each
    value: box/gguf_surgery.py)."""
    return cast(GgufRequest, {**request, "workspace": workspace, "plan": plan})


def _is_text(name: str) -> bool:
    """Whether a name from the box is valid Unicode (not bytes smuggled in as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reply(tool: str, raw: bytes) -> dict:
    return _checked(tool, _unpack(tool, raw))


def _unpack(tool: str, raw: bytes) -> dict:
    """A tool's reply: a JSON object on one line, and after it the bytes its log and range
    entries' "data_at" [start, length] point into, which become their "data"."""
    text, _, attached = raw.partition(b"\n")
    try:
        reply = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise BoxError(f"{tool} answered something that is not JSON: {raw[:200]!r}") from e
    if not isinstance(reply, dict):
        raise BoxError(f"{tool} answered {type(reply).__name__}, not an object")
    for key in ("logs", "ranges"):
        entries = reply.get(key)
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and "data_at" in entry:
                entry["data"] = _attachment(tool, attached, entry.pop("data_at"))
    return reply


def _attachment(tool: str, attached: bytes, at: Any) -> bytes:
    if not (isinstance(at, list) and len(at) == 2 and all(type(n) is int and n >= 0 for n in at)
            and at[0] + at[1] <= len(attached)):
        raise BoxError(f"{tool}: malformed reply: data_at {str(at)[:80]} is not within the "
                       f"{len(attached)} bytes attached")
    return attached[at[0]:at[0] + at[1]]


def _checked(tool: str, reply: dict) -> dict:
    if "error" in reply:
        raise BoxError(f"{tool}: {reply['error']}")
    return reply
