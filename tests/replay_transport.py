"""A Transport that answers the Box from a recorded box, in this process: no probe, no shell,
no process started, so `Box`, `ConsoleState`, the detectors and the panes are tested in
milliseconds.

What needs a real box's processes comes from the recording (tests/data/recorded_box.json, the
box the snapshot tests and the README's screenshot show): its processes, listeners, disks,
stage records, GPUs, artifact sizes, report files and shared writers, in `transport.probe`,
a probe reply a test edits as the box would change (a server started on a port, the disk
filling up, a stage ending). What lives in files is read from the workspace folder on this
machine by the box's own code, as the probe reads it: logs (markers, rotation and all, with
the descriptors a --serve probe holds), byte ranges, folder listings, the workspace's largest
users and Python packages. The recording's workspace is rewritten to that folder and its logs
written there, so its paths and the config's agree.

Every probe request is checked by the probe's own request check and kept (`requests`); `polls`
counts the snapshots answered, so that a test can wait for a poll that came after what it did
before it asserts that something did not happen. `down` makes every request fail as a lost
connection does. Tools run by `Box.call` (launch, kill, clean) are answered by `tools`, a
handler per module; `kill` ends the processes it names in the recording. With `clock` set, each
reply is timed by it (an app polling the replay box reads it as a live box).

A Textual app polls it when handed `open_box=lambda cfg: Box(transport, transport.workspace)`
(SamaiApp otherwise opens its box from the config's target, which names no replay box).
"""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from samai.remote.box import logfiles, watchers
from samai.remote.box import probe as box_probe
from samai.remote.box.disk import workspace_users
from samai.remote.box.packages import environments
from samai.remote.box.request_cache import HeldRequest, HeldUnknown
from samai.remote.box.serving import ServingReader
from samai.remote.transport import RunResult, TransportError
from tests import factories

RECORDING = Path(__file__).with_name("data") / "recorded_box.json"
Tool = Callable[[dict[str, Any]], dict[str, Any]]


class ReplayTransport:
    name = "replay"

    def __init__(self, probe: dict[str, Any], workspace: str | Path) -> None:
        self.probe = probe  # the recorded reply, as the next request gets it (logs aside)
        self.workspace = str(workspace)
        self.generation = 0
        self.requests: list[dict[str, Any]] = []  # every probe request, expanded, in order
        self.runs: list[tuple[str, dict[str, Any]]] = []  # every tool run: (module, request)
        # The recorded box keeps no checkpoints: a running training run's listing is empty.
        # The watchers' folder is the box tool itself, run here on the workspace's real folder.
        self.tools: dict[str, Tool] = {"kill": self._kill,
                                       "checkpoints": lambda req: {"folder": req["folder"], "checkpoints": []},
                                       "watchers": watchers.handle}
        self.down: str | None = None  # set: every request fails with this, as over a lost connection
        self.streams = 0  # probes opened
        self.clock: Callable[[], float] | None = None  # set: each reply's time is its reading (a live box)
        self.serving = ServingReader()  # the serving ports are real ones: read by the box's own reader

    @classmethod
    def recorded(cls, workspace: Path, recording: Path = RECORDING) -> ReplayTransport:
        """The recorded box with its workspace at `workspace` (created) and its logs written there."""
        data = json.loads(recording.read_text("utf-8"))
        workspace.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data["probe"]).replace(json.dumps(data["workspace"])[1:-1], json.dumps(str(workspace))[1:-1])
        transport = cls(json.loads(text), workspace)
        for name, log in data.get("logs", {}).items():
            transport.write_log(f"logs/{name}.log", log)
        return transport

    @classmethod
    def empty(cls, workspace: Path) -> ReplayTransport:
        """A box with one healthy disk and nothing running (tests.factories' defaults), its
        workspace at `workspace`: logs, reports and binaries are that folder's files."""
        snap = factories.snapshot(disks=[factories.disk(path=str(workspace))])
        probe = {key: factories.raw(getattr(snap, key)) for key in
                 ("time", "host", "boot_time", "disks", "processes", "listeners", "states")}
        workspace.mkdir(parents=True, exist_ok=True)
        return cls({**probe, "artifacts": []}, workspace)

    # ------------------------------------------------------------ editing the box

    def path(self, relative: str) -> Path:
        return Path(self.workspace, relative)

    def write_log(self, relative: str, text: str, *, append: bool = False) -> Path:
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def advance(self, seconds: float) -> float:
        """The box's clock moved on; its time now."""
        self.probe["time"] += seconds
        return self.probe["time"]

    def add(self, key: str, *entries: Any) -> None:
        """Model objects (tests.factories) added to a section of the reply ("processes", "listeners", ...)."""
        self.probe.setdefault(key, []).extend(factories.raw(e) for e in entries)

    def remove(self, key: str, **match: Any) -> None:
        """The entries of a section whose fields equal all of match, gone."""
        self.probe[key] = [e for e in self.probe.get(key, []) if any(e.get(k) != v for k, v in match.items())]

    def set_state(self, stage: str, **fields: Any) -> None:
        """A stage record's fields changed (its run ended: alive=False, rc=0)."""
        record = next(s for s in self.probe["states"] if s["stage"] == stage)
        record.update({k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})

    @property
    def polls(self) -> int:
        """The snapshots answered so far (requests that asked for processes)."""
        return sum(1 for r in self.requests if r.get("processes", True))

    # ------------------------------------------------------------ Transport

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
                  retry_safe: bool = False) -> RunResult:
        if self.down:
            raise TransportError(self.down)
        if list(argv[:2]) == ["test", "-f"]:
            return RunResult(0, b"", b"")  # the tools are installed
        if len(argv) < 4 or argv[1] != "-S" or argv[2] == "-c":
            raise TransportError(f"the replay box runs no {' '.join(argv)[:80]!r}")
        module, request = argv[3], json.loads(stdin or b"{}")
        self.runs.append((module, request))
        tool = self.tools.get(module)
        if tool is None:
            return RunResult(1, b"", f"{module}: not in the replay box".encode())
        return RunResult(0, json.dumps(tool(request)).encode(), b"")

    async def open_stream(self, argv: Sequence[str], *, preamble: bytes = b"") -> ReplayProbe:
        if self.down:
            raise TransportError(self.down)
        if "probe" not in argv or "--serve" not in argv:
            raise TransportError(f"the replay box streams no {' '.join(argv)[:80]!r}")
        self.streams += 1
        return ReplayProbe(self)

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------ the probe's reply

    def reply(self, req: dict[str, Any], logs: logfiles.HeldLogs) -> dict[str, Any]:
        reply = copy.deepcopy(self.probe)
        if self.clock is not None:
            reply["time"] = self.probe["time"] = self.clock()
        reply["errors"] = list(reply.get("errors") or [])
        reply["logs"] = logfiles.logs(req.get("logs") or (), logs)
        reply["ranges"] = logfiles.ranges(req.get("ranges") or ())
        reply["artifacts"] = self._artifacts(req.get("artifacts") or ())
        reply["reports"] = self._reports(req.get("reports") or (), reply)
        if "binaries" not in self.probe:
            reply["binaries"] = box_probe.binaries(self.workspace, req.get("binaries") or ())
        if not req.get("writers"):
            reply["writers"] = {}
        if not req.get("processes", True):
            reply["processes"], reply["listeners"] = [], []
        if not req.get("states", True):
            reply["states"] = []
        if not req.get("gpus", True):
            for key in ("gpus", "gpu_error", "gpu_driver", "gpu_events", "gpu_events_note"):
                reply.pop(key, None)
        if req.get("users") is not None:
            users = req["users"]
            reply["users"] = workspace_users(self.workspace, int(users.get("top", 10)), float(users.get("budget_s", 2)))
        if req.get("serving"):
            reply["serving"] = self.serving.read(req["serving"])
        if req.get("listing") is not None:
            reply["listing"] = box_probe.listing(self.workspace, req["listing"])
        if req.get("packages") is not None:
            reply["packages"] = environments(self.workspace, req["packages"])
        return reply

    def _artifacts(self, asked: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The recorded size of each artifact asked for; one the recording lacks does not exist."""
        recorded = {a["name"]: a for a in self.probe.get("artifacts", [])}
        return [copy.deepcopy(recorded.get(a["name"]))
                or {"name": a["name"], "path": posixpath.join(self.workspace, a["path"]), "exists": False}
                for a in asked]

    def _reports(self, specs: Sequence[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
        if "reports" not in self.probe:  # none recorded: the workspace's files, as the probe reads them
            return box_probe.reports(self.workspace, specs, reply["errors"])
        globs = {s["glob"] for s in specs}
        return [r for r in reply["reports"] if r["glob"] in globs]

    # ------------------------------------------------------------ tools

    def _kill(self, req: dict[str, Any]) -> dict[str, Any]:
        """kill.py on the recording: the process (its group with "group"), or a stage's group, ends."""
        if "stage" in req:
            record = next((s for s in self.probe["states"] if s["stage"] == req["stage"]), None)
            if record is None or not record.get("alive"):
                return {"ok": True, "result": "gone", "signalled": [], "survivors": [], "remaining": []}
            pgid = record["pgid"]
            record.update(alive=False, rc=143, stopped_at=self.probe["time"], group=[])
            return self._end(lambda p: p["pgid"] == pgid)
        proc = next((p for p in self.probe["processes"] if p["pid"] == req["pid"]), None)
        if proc is None or abs(proc["start_time"] - req["start_time"]) > 0.011:
            return {"ok": True, "result": "gone", "reason": "no such process", "signalled": [], "survivors": [],
                    "remaining": []}
        if req.get("group"):
            return self._end(lambda p: p["pgid"] == proc["pgid"])
        return self._end(lambda p: p["pid"] == proc["pid"])

    def _end(self, which: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        ended = [p["pid"] for p in self.probe["processes"] if which(p)]
        self.probe["processes"] = [p for p in self.probe["processes"] if p["pid"] not in ended]
        self.probe["listeners"] = [s for s in self.probe["listeners"] if s.get("pid") not in ended]
        return {"ok": True, "result": "exited", "signalled": ended, "survivors": [], "remaining": []}


class ReplayProbe:
    """A --serve probe on the replay box: requests sent as changes to the last one are expanded
    as the box's probe expands them, and the log bytes come back attached after the JSON."""

    persistent = True

    def __init__(self, box: ReplayTransport) -> None:
        self.box = box
        self.held = HeldRequest()
        self.logs = logfiles.HeldLogs()
        self.closed = False

    async def request(self, line: bytes, *, timeout: float) -> bytes:
        if self.closed:
            raise TransportError("the replay probe was closed")
        if self.box.down:
            self.closed = True
            raise TransportError(self.box.down)
        try:
            req = self.held.expand(json.loads(line))
            box_probe.check_request(req)  # what the console asks must be what the probe takes
        except HeldUnknown as e:
            return json.dumps({"error": str(e), "held_unknown": True}).encode()
        except ValueError as e:  # answered as the probe answers it: one error reply
            return json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        self.box.requests.append(req)
        reply = self.box.reply(req, self.logs)
        reply["held"] = self.held.keep(req)
        blobs: list[bytes] = []
        box_probe.pack_data(reply, blobs if req.get("attach") else None)
        return json.dumps(reply, separators=(",", ":")).encode() + b"\n" + b"".join(blobs)

    async def close(self) -> None:
        self.closed = True
        for key in list(self.logs.fds):
            self.logs.close(key)


class ReplayConsole:
    """The box screen's session (its state, its feeds, its log cursor) polled through a Box on a
    replay box, the way the app's poll loop does it, at the box's time."""

    def __init__(self, transport: ReplayTransport, config: Any) -> None:
        from samai.console.core.session import BoxSession
        from samai.remote.boxapi import Box

        self.transport = transport
        self.box = Box(transport, transport.workspace)
        self.session = BoxSession(config, lambda _: self.box, clock=lambda: transport.probe["time"], log=True)
        self.state = self.session.state
        self.cursor = self.session.cursor

    async def poll(self) -> Any:
        """One poll folded in at the box's time: its StateUpdate."""
        followers = self.state.followers(self.cursor)
        snap = await self.box.snapshot(**self.state.request(followers))
        return self.state.apply(snap, followers, snap.time, cursor=self.cursor)

    async def read(self) -> list[Any]:
        """The feeds' reads due now, each folded in: the updates they made."""
        return await self.session.read_due()

    async def look(self) -> Any:
        """A poll, then the reads due beside it (as the app's loop has them by its next poll): the last update."""
        update = await self.poll()
        read = await self.read()
        return read[-1] if read else update

    def active(self, code: str = "", stage: str | None = None) -> list[Any]:
        """The active alerts, of this detector code (or marker alerts, code "") and stage if given."""
        return [a for a in self.state.active_alerts() if (not code or a.code == code)
                and (stage is None or a.stage == stage)]

    async def close(self) -> None:
        await self.box.close()


def view(update: Any, kind: type) -> Any:
    """A feed's view in an update, which the test expects there."""
    found = update.view(kind)
    assert found is not None, f"no {kind.__name__} in this update"
    return found


def new_points(update: Any) -> list:
    """The training curve's new points in an update (none when its view is not there)."""
    from samai.console.core.training.feed import TrainingView

    found = update.view(TrainingView)
    return found.new_points if found else []


def log_lines(update: Any) -> list[str]:
    """The log pane's new lines in an update."""
    return update.log.lines if update.log else []
