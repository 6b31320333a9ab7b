"""samai.toml → typed, validated dataclasses.

Every problem is reported as FILE: KEY: what was expected, got what; nothing is guessed.
With no file, the built-in `tiny` pipeline on this machine is the configuration.
"""

from __future__ import annotations

import functools
import math
import os
import posixpath
import re
import shlex
import stat
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from samai.console.core import paths
from samai.console.core.commands import RESERVED_KEYS
from samai.console.core.roles import ROLES, Role
from samai.remote.marker import Marker

SEVERITIES = ("info", "warning", "error")
CHAIN_DONE = Marker("CHAIN_DONE", r"CHAIN_DONE rc=\d+", "info")
BUILTIN_PIPELINES = ("tiny", "samai-8b", "vlm-tiny", "samai-vl")
LAUNCHERS = ("torchrun", "deepspeed")  # the distributed launchers a multi-node stage runs under
TARGET_KEYS = {"url", "python", "poll_interval", "timeout", "keepalive_interval", "keepalive_count",
               "connect_timeout", "max_channels", "token_env"}
MAX_CONFIG_BYTES = 1 << 20  # a samai.toml is a few KB: anything bigger is not one
MAX_GB = 1_000_000.0  # a petabyte: any size or capacity above it is a typo
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # stage and pipeline names: safe as file names
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")  # a box's address for the other nodes: host or IP

# Folders that are the system itself, with everything in them: never a workspace.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr")
# Folders that hold other people's or the system's files: a folder inside one may be a
# workspace, the folder itself may not (a clean there would reach everything beside it).
SHARED_FOLDERS = ("/", "/home", "/root", "/tmp", "/var", "/var/tmp", "/var/lib", "/var/log", "/var/cache",
                  "/var/opt", "/var/spool", "/var/mail", "/var/www", "/opt", "/srv", "/mnt", "/media", "/snap")


class UnknownStage(ValueError):
    """A stage the config does not declare was named (on the command line, or by a caller)."""

    def __init__(self, name: str, config: Config) -> None:
        known = ", ".join(s.name for s in config.stages) or "none"
        super().__init__(f"unknown stage {name!r} (stages in {config.source}: {known})")


class ConfigError(Exception):
    def __init__(self, source: str, key: str, expected: str, got: Any = None) -> None:
        got_text = "" if got is None else f", got {_short(repr(got))}"
        super().__init__(f"{_one_line(source)}: {_one_line(key)}: expected {_one_line(expected)}{got_text}")
        self.source, self.key = source, key


def _clean_text(text: str) -> bool:
    """No NUL, and nothing that cannot be encoded (a lone surrogate): fit for argv, paths, env."""
    return "\0" not in text and (text.isascii() or _utf8(text))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _one_line(text: str) -> str:
    """A file name or a key (the user's own names are keys too) with its control characters escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True)
class Target:
    url: str = "local"
    python: str = ""  # the box's Python for the box tools (>= 3.8); empty: see box_python
    poll_interval: float = 1.0
    timeout: float = 30.0  # deadline of one call to the box
    keepalive_interval: float = 5.0  # SSH: a silent link is noticed after interval * count
    keepalive_count: int = 3
    connect_timeout: float = 10.0
    max_channels: int = 6  # SSH: concurrent channels on the one connection
    token_env: str = "SAMAI_ENVELOPE_TOKEN"  # envelope: the variable holding the gateway's token
    poll_interval_given: bool = False  # set in the config (a fleet adapts the interval of the others to its size)

    @property
    def is_local(self) -> bool:
        return self.url == "local"

    @property
    def box_python(self) -> str:
        """The console's own interpreter on this machine (no PATH shims to start), else python3."""
        return self.python or (sys.executable if self.is_local else "python3")


@dataclass(frozen=True)
class BoxSpec:
    """One box of a fleet ([boxes.NAME]): where it is and its workspace there."""

    name: str
    target: Target
    workspace: str
    address: str = ""  # where the other nodes reach this box (a multi-node master); empty: see node_address


@dataclass(frozen=True)
class Budget:
    capacity_gb: float | None = None  # the container's real size when statvfs overstates it
    reserve_gb: float = 2.0  # kept free on top of every projection


@dataclass(frozen=True)
class Artifact:
    name: str
    path: str  # relative paths are inside the workspace
    size_gb: float = 0.0  # the expected size, for projections before it exists
    intermediate: bool = False  # may be deleted once what it feeds exists


@functools.lru_cache(maxsize=512)
def command_words(command: str) -> tuple[str, ...] | None:
    """A stage command's words as the shell splits them (None: unbalanced quotes, so it cannot
    run either). Cached: the detectors and stage views read every command at every poll, and a
    command never changes."""
    try:
        return tuple(shlex.split(command))
    except ValueError:
        return None


@dataclass(frozen=True)
class Stage:
    name: str
    key: str
    command: str
    log: str
    description: str = ""
    role: Role = Role.OTHER  # the config's default is the stage's name when it is one
    markers: tuple[Marker, ...] = ()
    needs: tuple[str, ...] = ()
    makes: tuple[str, ...] = ()
    frees: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    poison: tuple[str, ...] = ()  # files a previous run leaves that must go before a restart
    env: tuple[tuple[str, str], ...] = ()
    nodes: tuple[str, ...] = ()  # a multi-node stage: the boxes it runs on, the first one the master
    launcher: str = ""  # a multi-node stage's launcher: one of LAUNCHERS
    rdzv_port: int = 29500  # a multi-node stage: the rendezvous (torchrun) or master (DeepSpeed) port on the master
    max_restarts: int = 0  # a multi-node torchrun stage: its --max-restarts
    checkpoints: str = ""  # a train-role stage: the folder of its checkpoint-STEP folders (a resume's)


@dataclass(frozen=True)
class Ui:
    theme: str = "samai-dark"
    max_log_lines: int = 20_000
    tail_lines: int = 200
    keys: tuple[tuple[str, str], ...] = ()  # binding id -> key, applied with App.set_keymap
    eval_reports: str = "runs/eval/*/summary.json"  # eval summaries, a glob in the workspace
    cu_reports: str = "runs/cu/*/summary.json"  # cu_eval's summaries (computer-use runs), likewise

    @property
    def reports(self) -> list[str]:
        """The report globs a poll asks for: the eval runs' and the computer-use runs'."""
        return [self.eval_reports, self.cu_reports]


# The fixes a watcher may run by itself when their alert stands ([watch] recover): each is a fix
# the TUI offers for that alert, run through the same action layer.
RECOVERIES = ("resume_train", "restart_serve", "restart_hung_serve")


@dataclass(frozen=True)
class Watch:
    """[watch]: the headless watcher (`samai-console watch`)."""

    interval: float = 10.0  # seconds between polls
    unreachable_after: float = 300.0  # a box silent this long is a notification (once), and its return another
    recover: tuple[str, ...] = ()  # RECOVERIES the watcher may run by itself; none: it only notifies
    max_recoveries: int = 3  # per stage per hour
    backoff_s: float = 30.0  # before a stage's second recovery within the hour; doubled for each one after


@dataclass(frozen=True)
class Serve:
    """[serve]: how the console watches a running server's monitoring endpoints."""

    hung_after_s: float = 60.0  # requests in flight without progress (or /health silent) this long: serve_hung
    every_s: float = 3.0  # the serving ports are asked at most this often, and only while a serve stage runs
    queue_polls: int = 3  # deferred requests growing at this many reads in a row: serve_queue


@dataclass(frozen=True)
class Train:
    """[train]: how a training run is compared with the last good run of its stage."""

    compare_factor: float = 1.5  # smoothed loss above this many times the reference's at the same step...
    compare_steps: int = 5  # ...at this many logged steps in a row: worse_than_reference
    compare_smooth: int = 5  # logged points in the moving mean both curves are smoothed with
    # A resumed run's loss at a step its dead run logged too: off by more than this (relative), it
    # is not the same run (resume_diverged). The tiny CPU pipeline's resume is exact to 1e-5.
    resume_tolerance: float = 1e-3
    max_loss_minutes: float = 30.0  # a save interval that loses more work than this to a death is said (not_resumable)
    # A multi-node run none of whose ranks logged a step for this long (or one of whose ranks did
    # not while another did) while every node's processes live is rank_stalled.
    stall_after_s: float = 120.0


@dataclass(frozen=True)
class Notify:
    """[notify]: where the watcher sends what it sees (apprise URLs), and how much."""

    urls: tuple[str, ...] = ()  # apprise URLs; they may hold secrets: never logged or shown
    urls_env: str = "SAMAI_NOTIFY_URLS"  # an environment variable holding more URLs (space or comma separated)
    min_severity: str = "error"  # alerts at or above it are sent
    repeat_after: float = 3600.0  # an alert still active and not acknowledged is sent again after this
    max_per_hour: int = 20


@dataclass(frozen=True)
class Config:
    source: str
    pipeline: str
    target: Target
    workspace: str
    budget: Budget
    artifacts: tuple[Artifact, ...]
    stages: tuple[Stage, ...]
    model: tuple[tuple[str, Any], ...] = ()
    ui: Ui = field(default_factory=Ui)
    boxes: tuple[BoxSpec, ...] = ()  # [boxes.NAME]; none: the one box of [target] and [workspace]
    watch: Watch = field(default_factory=Watch)
    notify: Notify = field(default_factory=Notify)
    serve: Serve = field(default_factory=Serve)
    train: Train = field(default_factory=Train)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def path_of(self, path: str) -> str:
        """A path on the box: a relative one is in the workspace."""
        return path if path.startswith("/") else posixpath.join(self.workspace, path)

    def stages_with_role(self, role: Role) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.role == role)

    def stage_by_role(self, role: Role) -> Stage | None:
        """The first stage of that role (the one followed where the console follows one: the curve)."""
        return next((s for s in self.stages if s.role == role), None)

    def role_name(self, role: Role) -> str:
        """The name of stage_by_role(role); "" when no stage has it (no stage is named "")."""
        stage = self.stage_by_role(role)
        return stage.name if stage else ""

    def artifact(self, name: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.name == name), None)

    def box(self, name: str) -> BoxSpec | None:
        return next((b for b in self.boxes if b.name == name), None)

    def on_box(self, name: str) -> Config:
        """This config as seen on one box of the fleet: its target and workspace (KeyError: no such box)."""
        spec = self.box(name)
        if spec is None:
            raise KeyError(name)
        return replace(self, target=spec.target, workspace=spec.workspace)

    def with_target(self, url: str) -> Config:
        workspace = self.workspace
        if self.target.is_local and url != "local" and workspace == str(paths.default_workspace(self.pipeline)):
            workspace = f"samai/{self.pipeline}"  # the default workspace of a remote box: in its home
        return replace(self, target=replace(self.target, url=url), workspace=workspace)


# ------------------------------------------------------------------ reading


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The config at path, or the built-in tiny pipeline when path is None."""
    if path is None:
        return load_builtin("tiny")
    source = str(path)
    try:
        text = read_capped(path, source).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(source, "(file)", "UTF-8 text", f"invalid byte at {e.start}") from e
    return parse(text, source)


def read_capped(path: str | os.PathLike[str], source: str) -> bytes:
    """The file's bytes, if it is a regular file of at most MAX_CONFIG_BYTES: a FIFO, a device
    (/dev/zero) or a huge file is refused before it is read, never read until memory runs out."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (OSError, ValueError) as e:
        raise ConfigError(source, "(file)", "a readable file", getattr(e, "strerror", None) or str(e)) from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(source, "(file)", "a regular file", _file_kind(mode))
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(source, "(file)", "a readable file", e.strerror) from e
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(source, "(file)", f"at most {MAX_CONFIG_BYTES} bytes", "a larger file")
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def load_builtin(name: str) -> Config:
    if name not in BUILTIN_PIPELINES:
        raise ConfigError("(built-in)", "pipeline", f"one of {', '.join(BUILTIN_PIPELINES)}", name)
    return parse(builtin_text(name), f"(built-in {name})")


def builtin_text(name: str) -> str:
    if name not in BUILTIN_PIPELINES:
        raise ConfigError("(built-in)", "pipeline", f"one of {', '.join(BUILTIN_PIPELINES)}", name)
    # package data beside this package (importlib.resources would cost the start-up its import)
    return (Path(__file__).parents[1] / "pipelines" / f"{name}.toml").read_text("utf-8")


def parse(text: str, source: str) -> Config:
    return from_raw(toml(text, source), source)


def toml(text: str, source: str) -> dict[str, Any]:
    """A config file's tables, as TOML reads them (ConfigError for what is not TOML)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "(syntax)", "valid TOML", str(e)) from e
    except RecursionError as e:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(source, "(syntax)", "valid TOML", "arrays or tables nested too deep") from e


def from_raw(raw: dict[str, Any], source: str) -> Config:
    """A config from its tables (a file's, or an incident bundle's), every key checked."""
    return _Reader(source).config(raw)


# ------------------------------------------------------------------ where the console may write


def escape_reason(path: str, workspace: str) -> str | None:
    """Why path, taken relative to the workspace, is not inside it; None when it is. Only the
    text is judged here: the box checks again, after symlinks, when it writes."""
    if path.startswith("~"):
        return "'~' is another folder"
    norm = posixpath.normpath(path) if path else "."
    if posixpath.isabs(norm):
        root = posixpath.normpath(workspace) if posixpath.isabs(workspace) else None
        if root is None or not _within(norm, root) or norm == root:
            return f"absolute and not under {workspace}"
        return None
    if norm == ".":
        return "it is the workspace itself"
    if norm == ".." or norm.startswith("../"):
        return "'..' leads out of it"
    return None


def local_workspace_reason(workspace: str) -> str | None:
    """Why a workspace on this machine would put the system's or the console's own files in
    reach of a clean; None when it is a folder of its own."""
    seen = {os.path.abspath(workspace), os.path.realpath(workspace)}
    home = {posixpath.normpath(str(Path.home())), os.path.realpath(Path.home())}
    for p in seen:
        problem = system_folder_reason(p, home)
        if problem:
            return problem
    room = {posixpath.normpath(str(paths.workspaces_dir())), os.path.realpath(paths.workspaces_dir())}
    for own in paths.own_dirs():
        for d in {posixpath.normpath(str(own)), os.path.realpath(own)}:
            for p in seen:
                if _within(d, p):
                    return f"a folder that holds the console's own files ({own})"
                if _within(p, d) and not any(_within(p, r) and p != r for r in room):
                    return f"a folder inside the console's own files ({own})"
    return None


def remote_workspace_reason(workspace: str) -> str | None:
    """The same for a box's workspace, judged by its text (relative: to the login's home)."""
    if workspace == "~":
        return "the home folder"
    if workspace.startswith("~"):
        return "another user's home folder"
    norm = posixpath.normpath(workspace) if workspace else "."
    if posixpath.isabs(norm):
        return system_folder_reason(norm, set())
    if norm == ".":
        return "the home folder"
    if norm == ".." or norm.startswith("../"):
        return "a folder outside the home folder ('..')"
    return None


def system_folder_reason(path: str, homes: set[str]) -> str | None:
    if path == "/":
        return "the root folder"
    for tree in SYSTEM_TREES:
        if _within(path, tree):
            return f"the system folder {tree}" + ("" if path == tree else " or one inside it")
    if path in SHARED_FOLDERS:
        return f"the shared folder {path}"
    if posixpath.dirname(path) == "/home" or path in homes:
        return f"a home folder ({path})"
    return None


def _within(path: str, folder: str) -> bool:
    """path is folder or anything below it (both normalised, absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# ------------------------------------------------------------------ validation


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, got: Any = None) -> ConfigError:
        return ConfigError(self.source, key, expected, got)

    def table(self, raw: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(key, "a table", raw)
        for name in raw:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                raise self.fail(where, f"one of the keys {', '.join(sorted(allowed))}", name)
        return raw

    def mapping(self, raw: Any, key: str) -> dict[str, Any]:
        """A table whose keys are the user's own names (stages, artifacts, model settings)."""
        return self.table(raw, key, set(raw) if isinstance(raw, dict) else set())

    def value(self, raw: dict[str, Any], key: str, where: str, kind: str, check: Callable[[Any], bool],
              default: Any) -> Any:
        if key not in raw:
            return default
        v = raw[key]
        if not check(v):
            raise self.fail(f"{where}.{key}" if where else key, kind, v)
        return v

    def text(self, raw, key, where, default=""):
        # A NUL cannot be part of an argument, a path or an environment value: refused here, not on the box.
        return self.value(raw, key, where, "a string (without NUL)", lambda v: isinstance(v, str) and _clean_text(v),
                          default)

    def number(self, raw, key, where, default, minimum=0.0, maximum=1e9):
        ok = lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
                        and (isinstance(v, int) or math.isfinite(v)) and minimum <= v <= maximum)
        return self.value(raw, key, where, f"a number >= {minimum:g} and <= {maximum:g}", ok, default)

    def integer(self, raw, key, where, default, minimum=1, maximum=10**9):
        ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum  # noqa: E731
        return self.value(raw, key, where, f"an integer >= {minimum} and <= {maximum}", ok, default)

    def path_inside(self, raw, key, where, workspace, default=""):
        """A path the console reads, writes or deletes in the workspace: relative to it, or
        absolute under it, and never leaving it (`..`, `~`)."""
        path = self.text(raw, key, where, default)
        problem = escape_reason(path, workspace)
        if problem:
            raise self.fail(f"{where}.{key}" if where else key, f"a path inside the workspace ({problem})", path)
        return path

    def names(self, raw, key, where):
        ok = lambda v: isinstance(v, list) and all(isinstance(x, str) and _clean_text(x) for x in v)  # noqa: E731
        return tuple(self.value(raw, key, where, "a list of strings", ok, []))

    # -------------------------------------------------------------- tables

    def config(self, raw: dict[str, Any]) -> Config:
        self.table(raw, "", {"pipeline", "target", "workspace", "budget", "artifacts", "stages", "model", "ui",
                             "boxes", "watch", "notify", "serve", "train"})
        pipeline = self.text(raw, "pipeline", "", "custom")
        if not NAME.match(pipeline):  # it names the default workspace's folder
            raise self.fail("pipeline", "a name of letters, digits, '_', '.', '-'", pipeline)
        boxes = self.boxes(raw, pipeline)
        if boxes:  # the console opens the first box; its target and workspace are the config's
            target, workspace = boxes[0].target, boxes[0].workspace
        else:
            target = self.target(raw.get("target"))
            workspace = self.workspace(raw.get("workspace"), pipeline, target)
        artifacts = self.artifacts(raw.get("artifacts"), workspace)
        stages = self.stages(raw.get("stages"), {a.name for a in artifacts}, workspace, {b.name for b in boxes})
        model = self.mapping(raw.get("model"), "model")
        self.mmproj(model, artifacts)
        return Config(
            source=self.source,
            pipeline=pipeline,
            target=target,
            workspace=workspace,
            budget=self.budget(raw.get("budget")),
            artifacts=artifacts,
            stages=stages,
            model=tuple(model.items()),
            ui=self.ui(raw.get("ui"), workspace),
            boxes=boxes,
            watch=self.watch(raw.get("watch")),
            notify=self.notify(raw.get("notify")),
            serve=self.serve(raw.get("serve")),
            train=self.train(raw.get("train")),
        )

    def boxes(self, raw: dict[str, Any], pipeline: str) -> tuple[BoxSpec, ...]:
        """[boxes.NAME] tables: url and workspace (both required) and any other [target] key.
        They replace [target] and [workspace], which then must not be given too."""
        table = self.mapping(raw.get("boxes"), "boxes")
        if table and ("target" in raw or "workspace" in raw):
            raise self.fail("boxes", "either [boxes.NAME] tables or [target] and [workspace], not both",
                            ", ".join(k for k in ("target", "workspace") if k in raw))
        out = []
        for name, spec in table.items():
            where = f"boxes.{name}"
            if not NAME.match(name):
                raise self.fail(where, "a box name of letters, digits, '_', '.', '-'", name)
            b = self.table(spec, where, TARGET_KEYS | {"workspace", "address"})
            for required in ("url", "workspace"):
                if required not in b:
                    raise self.fail(f"{where}.{required}", "the box's " + ("url (local, ssh://user@host[:port] or "
                                    "envelope+http(s)://host[:port])" if required == "url" else "workspace path"))
            target = self.target({k: v for k, v in b.items() if k not in ("workspace", "address")}, where)
            address = self.value(b, "address", where, "a host name or IP address the other boxes reach it at",
                                 lambda v: isinstance(v, str) and bool(ADDRESS.match(v)), "")
            out.append(BoxSpec(name, target, self.workspace({"path": b["workspace"]}, pipeline, target,
                                                            f"{where}.workspace"), address))
        return tuple(out)

    def mmproj(self, model: dict[str, Any], artifacts: tuple[Artifact, ...]) -> None:
        """[model] mmproj names the projector's artifact: a multimodal pipeline, served with --mmproj."""
        if "mmproj" not in model:
            return
        names = [a.name for a in artifacts]
        if model["mmproj"] not in names:
            declared = f" (declared: {', '.join(names)})" if names else " (none is declared)"
            raise self.fail("model.mmproj", "the name of an [artifacts.NAME] table holding the projector GGUF"
                            + declared, model["mmproj"])

    def target(self, raw: Any, where: str = "target") -> Target:
        t = self.table(raw, where, TARGET_KEYS)
        url = self.text(t, "url", where, "local")
        if not re.match(r"^(local|ssh://.+|envelope\+https?://.+)$", url):
            raise self.fail(f"{where}.url", "local, ssh://user@host[:port] or envelope+http(s)://host[:port]", url)
        return Target(url, self.text(t, "python", where, ""),
                      float(self.number(t, "poll_interval", where, 1.0, 0.1, 3600.0)),
                      float(self.number(t, "timeout", where, 30.0, 1.0, 86400.0)),
                      float(self.number(t, "keepalive_interval", where, 5.0, 0.0, 3600.0)),
                      self.integer(t, "keepalive_count", where, 3, 1, 1000),
                      float(self.number(t, "connect_timeout", where, 10.0, 0.5, 3600.0)),
                      self.integer(t, "max_channels", where, 6, 1, 1000),
                      self.text(t, "token_env", where, "SAMAI_ENVELOPE_TOKEN"),
                      "poll_interval" in t)

    def workspace(self, raw: Any, pipeline: str, target: Target, where: str = "workspace.path") -> str:
        w = self.table(raw, where.rsplit(".", 1)[0], {"path"})
        path = self.text(w, "path", where.rsplit(".", 1)[0], "")
        if not path:
            return str(paths.default_workspace(pipeline)) if target.is_local else f"samai/{pipeline}"
        if target.is_local:
            workspace = os.path.expanduser(path)
            problem = local_workspace_reason(workspace)
        else:
            workspace = path[2:] if path.startswith("~/") else path  # a remote command starts in the home folder
            problem = remote_workspace_reason(workspace)
        if problem:
            raise self.fail(where, f"a folder of its own for the pipeline, not {problem}", path)
        return workspace

    def budget(self, raw: Any) -> Budget:
        b = self.table(raw, "budget", {"capacity_gb", "reserve_gb"})
        capacity = self.number(b, "capacity_gb", "budget", None, 0.000001, MAX_GB)
        return Budget(capacity, float(self.number(b, "reserve_gb", "budget", 2.0, 0.0, MAX_GB)))

    def artifacts(self, raw: Any, workspace: str) -> tuple[Artifact, ...]:
        table = self.mapping(raw, "artifacts")
        out = []
        for name, spec in table.items():
            where = f"artifacts.{name}"
            a = self.table(spec, where, {"path", "size_gb", "intermediate"})
            if "path" not in a:
                raise self.fail(f"{where}.path", "the artifact's path (relative to the workspace)")
            out.append(Artifact(name, self.path_inside(a, "path", where, workspace),
                                float(self.number(a, "size_gb", where, 0.0, 0.0, MAX_GB)),
                                self.value(a, "intermediate", where, "true or false",
                                           lambda v: isinstance(v, bool), False)))
        return tuple(out)

    def stages(self, raw: Any, artifact_names: set[str], workspace: str, box_names: set[str]) -> tuple[Stage, ...]:
        table = self.mapping(raw, "stages")
        stages: list[Stage] = []
        for name, spec in table.items():
            stage = self.stage(name, spec, artifact_names, workspace)
            stage = replace(stage, **self.nodes(spec, f"stages.{name}", box_names))
            clash = next((s for s in stages if s.key == stage.key), None)
            if clash:
                raise self.fail(f"stages.{name}.key", f"a key no other stage uses ({clash.name} has it)", stage.key)
            stages.append(stage)
        return tuple(stages)

    def stage(self, name: str, raw: Any, artifact_names: set[str], workspace: str) -> Stage:
        where = f"stages.{name}"
        if not NAME.match(name):
            raise self.fail(where, "a stage name of letters, digits, '_', '.', '-'", name)
        s = self.table(raw, where, {"key", "command", "log", "description", "role", "markers", "needs", "makes",
                                    "frees", "ports", "poison", "env", "nodes", "launcher", "rdzv_port",
                                    "max_restarts", "checkpoints"})
        key = self.value(s, "key", where, "one key, not one the console uses itself ("
                         + " ".join(sorted(RESERVED_KEYS)) + ")",
                         lambda v: isinstance(v, str) and len(v) == 1 and v not in RESERVED_KEYS, None)
        if key is None:
            raise self.fail(f"{where}.key", "the key that fires this stage")
        command = self.text(s, "command", where)
        if not command.strip():
            raise self.fail(f"{where}.command", "the shell command the stage runs")
        refs = {}
        for field_name in ("needs", "makes", "frees"):
            refs[field_name] = self.names(s, field_name, where)
            unknown = [n for n in refs[field_name] if n not in artifact_names]
            if unknown:
                raise self.fail(f"{where}.{field_name}", "names of declared [artifacts]", unknown[0])
        ports = self.value(s, "ports", where, "a list of TCP ports (1-65535)",
                           lambda v: isinstance(v, list) and all(isinstance(p, int) and 0 < p < 65536 for p in v),
                           [])
        env = self.value(s, "env", where, "a table of NAME = \"string\" (NAME: letters, digits, '_')",
                         lambda v: isinstance(v, dict) and all(ENV_NAME.match(k) and isinstance(x, str)
                                                               and _clean_text(x) for k, x in v.items()), {})
        poison = self.names(s, "poison", where)
        for i, path in enumerate(poison):
            problem = escape_reason(path, workspace)
            if problem:
                raise self.fail(f"{where}.poison[{i}]", f"a path inside the workspace ({problem})", path)
        role = Role(self.value(s, "role", where, "one of " + ", ".join(ROLES), lambda v: v in ROLES,
                               name if name in ROLES else "other"))
        checkpoints = self.path_inside(s, "checkpoints", where, workspace) if "checkpoints" in s else ""
        if checkpoints and not role.resumable:
            raise self.fail(f"{where}.checkpoints", "a stage of role train to keep checkpoints (this one's role is "
                            f"{role})", checkpoints)
        return Stage(name=name, key=key, command=command,
                     log=self.path_inside(s, "log", where, workspace, f"logs/{name}.log"),
                     description=self.text(s, "description", where), role=role, checkpoints=checkpoints,
                     markers=self.markers(s.get("markers"), f"{where}.markers"),
                     needs=refs["needs"], makes=refs["makes"], frees=refs["frees"],
                     ports=tuple(ports), poison=poison, env=tuple(env.items()))

    def nodes(self, s: dict[str, Any], where: str, box_names: set[str]) -> dict[str, Any]:
        """A multi-node stage's `nodes` (declared boxes, each once) and `launcher`, given together."""
        nodes = self.names(s, "nodes", where)
        launcher = self.value(s, "launcher", where, " or ".join(LAUNCHERS), lambda v: v in LAUNCHERS, "")
        unknown = [n for n in nodes if n not in box_names]
        if unknown:
            declared = f" (declared: {', '.join(sorted(box_names))})" if box_names else " (none is declared)"
            raise self.fail(f"{where}.nodes", "names of [boxes.NAME] tables" + declared, unknown[0])
        if len(set(nodes)) != len(nodes):
            raise self.fail(f"{where}.nodes", "each box once", list(nodes))
        if bool(nodes) != bool(launcher):
            missing = "launcher" if nodes else "nodes"
            raise self.fail(f"{where}.{missing}", "nodes and launcher together (a multi-node stage has both)")
        given = [k for k in ("rdzv_port", "max_restarts") if k in s]
        if given and not nodes:
            raise self.fail(f"{where}.{given[0]}", "a multi-node stage (nodes and launcher) to take it")
        return {"nodes": nodes, "launcher": launcher,
                "rdzv_port": self.integer(s, "rdzv_port", where, 29500, 1, 65535),
                "max_restarts": self.integer(s, "max_restarts", where, 0, 0, 100)}

    def markers(self, raw: Any, where: str) -> tuple[Marker, ...]:
        if raw is None:
            return (CHAIN_DONE,)
        if not isinstance(raw, list):
            raise self.fail(where, "a list of { name, pattern, severity } tables", raw)
        out = [CHAIN_DONE]
        for i, spec in enumerate(raw):
            at = f"{where}[{i}]"
            m = self.table(spec, at, {"name", "pattern", "severity"})
            name = self.text(m, "name", at)
            if not name:
                raise self.fail(f"{at}.name", "the marker's name")
            pattern = self.text(m, "pattern", at, re.escape(name))
            try:
                re.compile(pattern.encode())
            except (re.error, OverflowError, RecursionError) as e:  # a huge repeat count, groups nested too deep
                raise self.fail(f"{at}.pattern", "a valid regular expression", f"{pattern} ({e})") from e
            severity = self.value(m, "severity", at, " or ".join(SEVERITIES), lambda v: v in SEVERITIES, "info")
            out.append(Marker(name, pattern, severity))
        return tuple(m for i, m in enumerate(out) if m.name not in {o.name for o in out[:i]})

    def ui(self, raw: Any, workspace: str) -> Ui:
        u = self.table(raw, "ui", {"theme", "max_log_lines", "tail_lines", "keys", "eval_reports", "cu_reports"})
        keys = self.value(u, "keys", "ui", "a table of binding id = \"key\"",
                          lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), {})
        return Ui(self.text(u, "theme", "ui", "samai-dark"),
                  self.integer(u, "max_log_lines", "ui", 20_000, 100, 10_000_000),
                  self.integer(u, "tail_lines", "ui", 200, 0, 1_000_000),
                  tuple(keys.items()),
                  self.path_inside(u, "eval_reports", "ui", workspace, "runs/eval/*/summary.json"),
                  self.path_inside(u, "cu_reports", "ui", workspace, "runs/cu/*/summary.json"))

    def watch(self, raw: Any) -> Watch:
        w = self.table(raw, "watch", {"interval", "unreachable_after", "recover", "max_recoveries", "backoff_s"})
        recover = self.names(w, "recover", "watch")
        unknown = [r for r in recover if r not in RECOVERIES]
        if unknown:
            raise self.fail("watch.recover", "a list of " + ", ".join(RECOVERIES), unknown[0])
        return Watch(float(self.number(w, "interval", "watch", 10.0, 0.1, 86400.0)),
                     float(self.number(w, "unreachable_after", "watch", 300.0, 0.0, 7 * 86400.0)),
                     tuple(dict.fromkeys(recover)), self.integer(w, "max_recoveries", "watch", 3, 0, 1000),
                     float(self.number(w, "backoff_s", "watch", 30.0, 0.0, 3600.0)))

    def serve(self, raw: Any) -> Serve:
        v = self.table(raw, "serve", {"hung_after_s", "every_s", "queue_polls"})
        return Serve(float(self.number(v, "hung_after_s", "serve", 60.0, 1.0, 86400.0)),
                     float(self.number(v, "every_s", "serve", 3.0, 0.5, 3600.0)),
                     self.integer(v, "queue_polls", "serve", 3, 1, 1000))

    def train(self, raw: Any) -> Train:
        t = self.table(raw, "train", {"compare_factor", "compare_steps", "compare_smooth", "resume_tolerance",
                                      "max_loss_minutes", "stall_after_s"})
        return Train(float(self.number(t, "compare_factor", "train", 1.5, 1.01, 1000.0)),
                     self.integer(t, "compare_steps", "train", 5, 1, 100_000),
                     self.integer(t, "compare_smooth", "train", 5, 1, 1000),
                     float(self.number(t, "resume_tolerance", "train", 1e-3, 0.0, 1.0)),
                     float(self.number(t, "max_loss_minutes", "train", 30.0, 0.1, 100_000.0)),
                     float(self.number(t, "stall_after_s", "train", 120.0, 1.0, 7 * 86400.0)))

    def notify(self, raw: Any) -> Notify:
        n = self.table(raw, "notify", {"urls", "urls_env", "min_severity", "repeat_after", "max_per_hour"})
        urls = n.get("urls", [])
        # Never quoted back in the error: a URL may hold a password.
        if not isinstance(urls, list):
            raise self.fail("notify.urls", "a list of apprise URLs")
        for i, url in enumerate(urls):
            if not (isinstance(url, str) and _clean_text(url) and "://" in url and not any(c.isspace() for c in url)):
                raise self.fail(f"notify.urls[{i}]", "an apprise URL (a string scheme://…, without spaces)")
        urls_env = self.value(n, "urls_env", "notify", "an environment variable's name (letters, digits, '_')",
                              lambda v: isinstance(v, str) and bool(ENV_NAME.match(v)), "SAMAI_NOTIFY_URLS")
        return Notify(tuple(urls), urls_env,
                      self.value(n, "min_severity", "notify", " or ".join(SEVERITIES), lambda v: v in SEVERITIES,
                                 "error"),
                      float(self.number(n, "repeat_after", "notify", 3600.0, 1.0, 30 * 86400.0)),
                      self.integer(n, "max_per_hour", "notify", 20, 1, 10_000))
