"""The wire between the console and the box tools: each tool's name, and the JSON objects of its
request and reply as TypedDicts, imported by both ends (the tools here; remote/boxapi.py, which
builds the requests, and remote/model.py, which reads the replies), so that a key renamed on one
side is a type error on the other.

Runs ON the box too: standard library only, Python >= 3.8 (typing's TypedDict, Literal, Final,
Dict, List, Optional, Union: no newer spelling is evaluated at run time).

The types are for the type checker only. What crosses the wire is untrusted both ways: a tool
checks every value of its request at run time (a request it cannot read is one error), and the
console checks every value of a reply where it reads it (remote/model.py). A reply type names the
keys the tool writes and the console reads: a promise of the tool's code, never of the bytes that
come back. Any reply may instead be {"error": TEXT} (procfs.serve), which the Box raises before it
reads anything else.

A key the console sends is read on the box by subscript (`req["grace"]`) or through `.get()`:
a type checker checks the first against these types, not the second (PEP 589 lets `.get` take
any key), so tests/test_wire.py checks that every literal key a tool reads from its request is
one declared here.
"""

from __future__ import annotations

from typing import Any, Dict, Final, List, Literal, Optional, TypedDict, Union


class Tool:
    """The box tools the console runs, by their file in the package (boxtools.module_of)."""

    PROBE: Final = "probe.py"
    LAUNCH: Final = "launch.py"
    KILL: Final = "kill.py"
    CLEAN: Final = "clean.py"
    INSTALL: Final = "install.py"
    CHECKPOINTS: Final = "checkpoints.py"
    WATCHERS: Final = "watchers.py"
    GGUF_SURGERY: Final = "gguf_surgery.py"
    RUNHASH: Final = "runhash.py"


# ------------------------------------------------------------ probe.py


class ArtifactSpec(TypedDict, total=False):
    name: str
    path: str


class MarkerSpec(TypedDict, total=False):
    name: str
    pattern: Optional[str]
    needles: Optional[List[str]]


class LogSpec(TypedDict, total=False):
    """One followed log (remote/follow.py LogCursor.request): its cursor and what to read."""

    path: str
    offset: Optional[int]
    inode: Optional[int]
    dev: Optional[int]
    mtime: Optional[float]
    drained: bool  # the last read reached the end of the file the path named before
    older: Optional[List[int]]
    check: str  # base64 of the last bytes read
    scan_from: Optional[int]
    last_lines: Optional[int]
    max_bytes: Optional[int]
    data: bool
    markers: List[MarkerSpec]


class RangeSpec(TypedDict):
    path: str
    start: int
    end: int  # inclusive


class ReportSpec(TypedDict, total=False):
    glob: str
    max: int


class UsersSpec(TypedDict, total=False):
    top: int
    budget_s: float


class ListingSpec(TypedDict, total=False):
    path: str
    prefix: str
    max: int


class PackagesSpec(TypedDict, total=False):
    python: str
    names: List[str]
    max: int


class ServingSpec(TypedDict, total=False):
    ports: List[int]
    paths: List[str]
    props: List[int]
    canary: List[int]
    budget_s: float


class ProbeRequest(TypedDict, total=False):
    """Every key optional (probe.py's docstring says each one's meaning)."""

    workspace: str
    artifacts: List[ArtifactSpec]
    artifact_budget_s: float
    logs: List[LogSpec]
    ranges: List[RangeSpec]
    reports: List[ReportSpec]
    processes: Union[bool, Literal["stages"]]
    processes_since: str
    states: bool
    writers: bool
    binaries: List[str]
    users: UsersSpec
    listing: ListingSpec
    packages: List[PackagesSpec]
    gpus: bool
    attach: bool
    serving: ServingSpec


class DiskEntry(TypedDict):
    label: str  # workspace | root
    path: str
    mount: str
    total: int
    used: int
    free: int


class ArtifactEntry(TypedDict, total=False):
    name: str
    path: str
    exists: bool
    bytes: int
    allocated: int
    files: int
    complete: bool  # false: the size walk ran out of its time budget
    error: str


class DiskUserEntry(TypedDict):
    path: str  # relative to the workspace
    bytes: int
    allocated: int
    files: int
    complete: bool


class UsersReply(TypedDict):
    top: List[DiskUserEntry]
    allocated: int
    entries: int
    complete: bool


class BinaryEntry(TypedDict):
    path: str
    exists: bool
    executable: bool


class MemoryReading(TypedDict, total=False):
    total: int
    available: int
    cgroup: str
    limit: int


class ListingReply(TypedDict, total=False):
    path: str
    entries: List[str]
    complete: bool
    error: str


class GpuSection(TypedDict, total=False):
    """The probe reply's GPU keys (gpus.py)."""

    gpus: List[Dict[str, Any]]
    gpu_error: Optional[str]
    gpu_driver: Optional[str]
    gpu_events: List[Dict[str, Any]]
    gpu_events_note: Optional[str]


class ProbeReply(GpuSection, total=False):
    time: float
    boot_time: float
    boot_id: Optional[str]
    clk_tck: int
    host: str
    probe_pid: int
    errors: List[Dict[str, str]]
    disks: List[DiskEntry]
    artifacts: List[ArtifactEntry]
    processes: List[Dict[str, Any]]
    processes_mark: str  # a --serve probe's mark of this reply's processes
    processes_since: str  # the mark the processes are changes since
    processes_gone: List[int]
    listeners: List[Dict[str, Any]]
    writers: Dict[str, List[int]]
    binaries: List[BinaryEntry]
    users: UsersReply
    listing: ListingReply
    packages: List[Dict[str, Any]]
    logs: List[Dict[str, Any]]
    ranges: List[Dict[str, Any]]
    reports: List[Dict[str, Any]]
    states: List[StageState]
    memory: MemoryReading
    serving: List[Dict[str, Any]]
    held: Optional[str]  # what a --serve probe keeps of this request (request_cache)
    held_unknown: bool  # the request named a base the probe does not hold: send it whole
    tools_missing: bool  # the starter's: the tools are not installed (boxtools.STARTER)
    error: str


# ------------------------------------------------------------ launch.py


class LaunchRequest(TypedDict, total=False):
    stage: str
    workspace: str
    command: str
    log: str
    env: Dict[str, str]
    verify_s: float


class LaunchRecord(TypedDict, total=False):
    """A stage's record, WORKSPACE/.samai/state/STAGE.json, as launch.py writes it."""

    stage: str
    pid: int
    pgid: int
    sid: int
    start_time: Optional[float]
    boot_time: float
    boot_id: Optional[str]
    log: str
    cmd: str
    chain: str
    fired_at: float
    chain_id: str
    nonce: str


class StageState(LaunchRecord, total=False):
    """A stage's record as the probe sends it: with whether it runs, its processes, its exit
    status and, when it stopped or died, by whom and why."""

    alive: bool
    group: List[int]
    rc: Optional[int]
    stopped_at: Optional[float]
    stopped_by: str
    death: Optional[Dict[str, Any]]  # {"cause", "detail", "evidence"}


class LaunchReply(LaunchRecord, total=False):
    ok: bool
    state: str  # running | done | failed | refused
    reason: str
    rc: Optional[int]
    log_tail: List[str]


# ------------------------------------------------------------ kill.py


class KillRequest(TypedDict, total=False):
    """A process ("pid", "start_time", "group", and the boot its start time was read on), or
    every process of a recorded stage ("stage", "workspace", "by")."""

    pid: int
    start_time: float
    boot_time: float
    boot_id: Optional[str]
    group: bool
    stage: str
    workspace: str
    by: str
    signal: str  # TERM | KILL | INT | HUP
    grace: float
    protect: List[int]


class KillReply(TypedDict, total=False):
    ok: bool
    result: str  # exited | killed | failed | refused | gone
    reason: str
    pgid: Optional[int]
    signalled: List[int]
    survivors: List[int]
    remaining: List[int]


# ------------------------------------------------------------ clean.py


class CleanRequest(TypedDict):
    workspace: str
    paths: List[str]


class Removed(TypedDict):
    path: str
    bytes: int


class Refused(TypedDict):
    path: str
    reason: str


class CleanReply(TypedDict):
    removed: List[Removed]
    refused: List[Refused]
    missing: List[str]


# ------------------------------------------------------------ checkpoints.py


class CheckpointsRequest(TypedDict, total=False):
    workspace: str
    folder: str
    weights: bool
    legacy: bool  # a checkpoint without a completeness record judged by its content alone


class CheckpointEntry(TypedDict, total=False):
    name: str
    step: int
    mtime: float
    files: int
    bytes: int
    complete: bool
    missing: List[str]
    temporary: List[str]
    settling: bool
    finite: Optional[bool]
    nonfinite: List[str]
    weights: Optional[str]
    problems: List[str]


class CheckpointsReply(TypedDict, total=False):
    folder: str
    checkpoints: List[CheckpointEntry]
    unjudged: int
    error: str


# ------------------------------------------------------------ watchers.py


class WatchersRequest(TypedDict, total=False):
    """op "read"; "beat" with id, heartbeat, lease_s, ledger, release; "ack" with keys, by, text."""

    workspace: str
    op: str  # read | beat | ack
    id: str
    heartbeat: Dict[str, Any]
    lease_s: float
    ledger: Optional[Dict[str, Any]]
    release: bool
    keys: List[str]
    by: str
    text: Dict[str, str]


class Leader(TypedDict, total=False):
    id: str
    since: float
    who: str  # as the leader's heartbeat said it (cut to 200 characters)


class WatchersReply(TypedDict, total=False):
    watchers: List[Dict[str, Any]]
    leader: Optional[Leader]
    leading: bool
    ledger: Dict[str, Any]
    acks: Dict[str, Any]
    now: float
    problems: List[str]


# ------------------------------------------------------------ gguf_surgery.py


class GgufRequest(TypedDict, total=False):
    """op "show" (path); "set_kv" (path, out, set, types); "add_tensors" (path, donor, tensors,
    out, expect_tensors, expect_last); "extract" (path, tensors, out); a write op with plan and,
    given back, the plan's pin."""

    op: str
    workspace: str
    path: str
    out: str
    set: Dict[str, Any]
    types: Dict[str, str]
    donor: str
    tensors: List[str]
    expect_tensors: int
    expect_last: str
    plan: bool
    pin: Dict[str, Any]
    redirect_hosts: List[str]


class Assertion(TypedDict):
    name: str
    ok: bool
    detail: str


class GgufWriteReply(TypedDict, total=False):
    ok: bool
    op: str
    out: str
    planned: bool
    bytes: int
    tensors: int
    last_tensor: Optional[str]
    added: List[str]
    fetched: int
    donor_size: Optional[int]
    free: int
    pin: Dict[str, Any]
    assertions: List[Assertion]
    failure: str


# ------------------------------------------------------------ runhash.py, install.py


class RunhashRequest(TypedDict, total=False):
    workspace: str
    python: str
    module: str
    script: str


class RunhashReply(TypedDict, total=False):
    tools: Optional[str]
    tools_note: str
    program: str
    sha256: str
    bytes: int
    program_error: Optional[str]


class InstallReply(TypedDict, total=False):
    ok: bool
    tools: str
    error: str
