"""A multi-node stage: its command on every node under a distributed launcher, and the run as one.

Launching stays with the launchers (torchrun's c10d rendezvous, DeepSpeed's launcher without ssh):
this module only writes each node's command line for them, records the run (which node, its
node rank, pid and start time), and reads what the nodes' states and logs say about it. The
stage's command is `PYTHON -m MODULE ARGS` or `PYTHON SCRIPT.py ARGS`: PYTHON runs the launcher,
which runs the program with its arguments on each node.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from samai.console.core import paths
from samai.console.core.config import BoxSpec, Config, Stage

# The interpreter word and the program after it: `-m pkg.mod ARGS` or `path/to/script.py ARGS`.
PROGRAM = re.compile(r"^\s*(?P<python>[A-Za-z0-9_./+-]+)\s+(?P<program>(?:-m\s+[A-Za-z_][A-Za-z0-9_.]*"
                     r"|[A-Za-z0-9_./+-]+\.py)(?:\s.*)?)$", re.S)
PYTHON_NAME = re.compile(r"^python(3(\.[0-9]+)?)?$")
HOSTFILE_DIR = ".samai/multinode"  # DeepSpeed's hostfile of a run, in each node's workspace
RECORD_VERSION = 1


class MultiNodeError(ValueError):
    """A multi-node stage that cannot be launched as configured (the message names the key)."""


@dataclass(frozen=True)
class Program:
    python: str  # the interpreter the stage's command names: it runs the launcher
    module: str  # `-m MODULE`, or ""
    script: str  # or the script, relative to the workspace
    text: str  # the program and its arguments, as the config writes them (shell words kept)


@dataclass(frozen=True)
class NodeLaunch:
    node: str  # the box's name
    rank: int  # its node rank (0: the master)
    target: str
    workspace: str
    command: str  # exactly what its chain runs


@dataclass(frozen=True)
class NodeRun:
    node: str
    rank: int
    target: str
    workspace: str
    log: str
    command: str
    pid: int | None = None
    start_time: float | None = None

    @property
    def log_path(self) -> str:
        """The node's log on its box."""
        return posixpath.join(self.workspace, self.log)


@dataclass(frozen=True)
class MultiRun:
    """One multi-node run as fired: recorded on this machine, its nodes' launches on their boxes."""

    stage: str
    launcher: str
    run_id: str
    master: str  # ADDRESS:PORT of the rendezvous (torchrun) or the master (DeepSpeed)
    fired_at: float
    nodes: tuple[NodeRun, ...]

    def node(self, name: str) -> NodeRun | None:
        return next((n for n in self.nodes if n.node == name), None)


def node_address(spec: BoxSpec) -> str:
    """Where the other nodes reach this box: its `address`, else its url's host (127.0.0.1 for local)."""
    if spec.address:
        return spec.address
    if spec.target.is_local:
        return "127.0.0.1"
    url = spec.target.url.split("+", 1)[1] if spec.target.url.startswith("envelope+") else spec.target.url
    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    return host or "127.0.0.1"


def program_of(stage: Stage) -> Program:
    """The interpreter and the program of a multi-node stage's command."""
    found = PROGRAM.match(stage.command)
    if not found or not PYTHON_NAME.match(posixpath.basename(found["python"])):
        raise MultiNodeError(f"stages.{stage.name}.command: a multi-node stage runs `PYTHON -m MODULE ARGS` or "
                             f"`PYTHON SCRIPT.py ARGS` (PYTHON runs the {stage.launcher} launcher), got "
                             f"{stage.command[:120]!r}")
    program = found["program"].strip()
    words = program.split(None, 2)
    module = words[1] if words[0] == "-m" else ""
    return Program(found["python"], module, "" if module else words[0], program)


def new_run_id(stage: str) -> str:
    """The rendezvous id: unique per fire, so that a node of an earlier run never joins this one."""
    return f"{stage}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def launches(cfg: Config, stage: Stage, run_id: str) -> tuple[NodeLaunch, ...]:
    """Each node's exact command, the master first."""
    if not stage.nodes:
        raise MultiNodeError(f"stages.{stage.name}: not a multi-node stage (no nodes)")
    program = program_of(stage)
    specs = [_spec(cfg, stage, n) for n in stage.nodes]
    master = f"{node_address(specs[0])}:{stage.rdzv_port}"
    out = []
    for rank, spec in enumerate(specs):
        argv = (_torchrun if stage.launcher == "torchrun" else _deepspeed)(stage, program, rank, master, run_id)
        command = " ".join(shlex.quote(w) for w in argv) + " " + _launched_program(stage, program)
        if stage.launcher == "deepspeed":
            command = f"{_hostfile_command(stage, run_id)} && {command}"
        out.append(NodeLaunch(spec.name, rank, spec.target.url, spec.workspace, command))
    return tuple(out)


def master_of(cfg: Config, stage: Stage) -> tuple[str, int]:
    return node_address(_spec(cfg, stage, stage.nodes[0])), stage.rdzv_port


def _spec(cfg: Config, stage: Stage, name: str) -> BoxSpec:
    spec = cfg.box(name)
    if spec is None:
        raise MultiNodeError(f"stages.{stage.name}.nodes: no [boxes.{name}] table")
    return spec


def _torchrun(stage: Stage, program: Program, rank: int, master: str, run_id: str) -> list[str]:
    """torch/distributed/run.py's own flags: one worker per node, the c10d rendezvous on the master."""
    return [program.python, "-m", "torch.distributed.run", "--nnodes", str(len(stage.nodes)),
            "--node-rank", str(rank), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", master, "--rdzv-id", run_id, "--max-restarts", str(stage.max_restarts)]


def _deepspeed(stage: Stage, program: Program, rank: int, master: str, run_id: str) -> list[str]:
    """deepspeed/launcher/runner.py without ssh: each node starts its own share, told its rank and
    the master; the hostfile names the nodes (one slot each), --no_local_rank keeps the program's
    arguments its own (the rank comes in LOCAL_RANK/RANK, as under torchrun)."""
    address, port = master.rsplit(":", 1)
    return [program.python, "-m", "deepspeed.launcher.runner", "--no_ssh", "--hostfile", _hostfile(stage, run_id),
            "--num_nodes", str(len(stage.nodes)), "--num_gpus", "1", "--node_rank", str(rank),
            "--master_addr", address, "--master_port", port, "--no_local_rank"]


def _launched_program(stage: Stage, program: Program) -> str:
    """The program as the launcher takes it: DeepSpeed's runner says --module where torchrun says -m."""
    if stage.launcher == "deepspeed" and program.module:
        return "--module " + program.text[len("-m"):].lstrip()
    return program.text


def _hostfile(stage: Stage, run_id: str) -> str:
    return f"{HOSTFILE_DIR}/{run_id}.hostfile"


def _hostfile_command(stage: Stage, run_id: str) -> str:
    lines = "".join(f"{n} slots=1\\n" for n in stage.nodes)
    return f"mkdir -p {HOSTFILE_DIR} && printf {shlex.quote(lines)} > {shlex.quote(_hostfile(stage, run_id))}"


# ------------------------------------------------------------------ the record of a run


def record_path(cfg: Config, stage: str) -> Path:
    return paths.state_dir() / "multinode" / f"{cfg.pipeline}.{stage}.json"


def save_run(cfg: Config, run: MultiRun) -> Path:
    """The run, written whole and renamed into place: a console that restarts finds it again."""
    path = record_path(cfg, run.stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps({"version": RECORD_VERSION, **asdict(run)}, indent=1))
    os.replace(part, path)
    return path


def load_run(cfg: Config, stage: str) -> MultiRun | None:
    """The stage's last recorded run; None when there is none or it cannot be read."""
    try:
        raw = json.loads(record_path(cfg, stage).read_text())
        nodes = tuple(NodeRun(**n) for n in raw["nodes"])
        run = MultiRun(raw["stage"], raw["launcher"], raw["run_id"], raw["master"], float(raw["fired_at"]), nodes)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return run if all(_well_typed(n) for n in run.nodes) and run.stage == stage else None


def _well_typed(node: NodeRun) -> bool:
    """A record edited or cut by hand is no record: every field of the type the watch compares."""
    number = (int, float)
    return (all(isinstance(v, str) for v in (node.node, node.target, node.workspace, node.log, node.command))
            and type(node.rank) is int and (node.pid is None or type(node.pid) is int)
            and (node.start_time is None or (isinstance(node.start_time, number)
                                             and not isinstance(node.start_time, bool))))


# ------------------------------------------------------------------ what a node's log says

# The train stage's own line under a launcher; torch's prefix of a worker's lines; torchrun's summary.
RANK_LINES = (re.compile(rb"TRAIN_RANK rank=(\d{1,6}) world_size=\d{1,6}"), re.compile(rb"(?m)^\[rank(\d{1,6})\]:"),
              re.compile(rb"rank\s*:\s*(\d{1,6}) \(local_rank"))
PROGRESS = re.compile(rb"(?m)^train (\d{1,12})/(\d{1,12}) \[")  # the train stage's progress line: step/total


def rank_in_log(data: bytes) -> int | None:
    """The distributed rank the node's log says it ran as (torchrun's c10d rendezvous assigns
    ranks itself: it need not be the node rank)."""
    ranks = ranks_in_log(data)
    return ranks[-1] if ranks else None


def ranks_in_log(data: bytes) -> list[int]:
    """Every rank the node's log names, in order: several where a node runs several processes."""
    for pattern in RANK_LINES:
        found = pattern.findall(data)
        if found:
            return [int(rank) for rank in found]
    return []


def world_size_in_log(data: bytes) -> int | None:
    found = re.findall(rb"TRAIN_RANK rank=\d{1,6} world_size=(\d{1,6})", data)
    return int(found[-1]) if found else None


def last_step_in_log(data: bytes) -> int | None:
    """The last training step the log shows: the progress line's, else the trainer's last logged point."""
    found = progress_in_log(data)
    if found:
        return found[0]
    from samai.console.core.training.trainlog import check_trainlog  # only for a log without progress lines

    points = check_trainlog(data.decode("utf-8", "replace")).points
    return points[-1].step if points else None


def progress_in_log(data: bytes) -> tuple[int, int] | None:
    """The last progress line's step and total steps (None: the bytes hold none)."""
    found = PROGRESS.findall(data)
    return (int(found[-1][0]), int(found[-1][1])) if found else None
