"""Box-wide detectors: each trap of the playbook that the box shows, as a finding with the action
that deals with it. One registry (DETECTORS) runs them all over one DetectorContext: `doctor`
prints what it finds, the TUI's state raises it as alerts and binds their action (which then goes
through its usual confirmation). The same context gives the same findings, whoever asks."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from samai.console.core import units
from samai.console.core.browsers import browser_missing, browser_names
from samai.console.core.config import Config, Stage, command_words
from samai.console.core.disk.budget import GB, DiskBudget, disk_budget, project
from samai.console.core.disk.trends import (
    DiskTrend,
    MemoryTrend,
    checkpoint_findings,
    filling_findings,
    memory_findings,
)
from samai.console.core.evals.runs import EvalRun, RunCheck, read_eval_runs
from samai.console.core.fixes import CLEAN, FixAction
from samai.console.core.gpus.findings import GpuWatch
from samai.console.core.mmproj import has_mmproj, mmproj_artifact
from samai.console.core.preflight import present_poison
from samai.console.core.problems import Finding
from samai.console.core.roles import Role
from samai.console.core.serving.watch import ServingWatch
from samai.remote.model import Checkpoints, Process, PythonPackages, Snapshot

__all__ = ["DETECTORS", "DetectorContext", "DetectorRegistry", "Finding", "detect"]

# The [model] settings that name binaries the pipeline runs (checked for the tar-prefix trap).
BINARY_SETTINGS = ("llama_server", "llama_quantize")
# The box's stage modules that import peft, the stage roles that run peft whatever module they run,
# and the distributions their environment is checked for (§9).
PEFT_MODULES = ("train", "merge")
WATCHED_PACKAGES = ("peft", "torchao")
PYTHON = re.compile(r"^python(3(\.[0-9]+)?)?$")
INTERNAL_ERROR = "internal_error"  # the code of a detector that raised


@dataclass(frozen=True)
class DetectorContext:
    """Everything a detector reads: the config, one snapshot and its disk budget, and what is read
    apart from the poll (the training environments, the newest eval run's check) or kept across
    polls (the GPU watch). `doctor` fills it from one look at the box, the TUI's state from its poll."""

    config: Config
    snapshot: Snapshot
    budget: DiskBudget
    environments: tuple[PythonPackages, ...] = ()
    # The newest eval run and its items' check (that None: not read yet, or unreadable); None: no run.
    eval_checked: tuple[EvalRun, RunCheck | None] | None = None
    # The recent GPU readings, fed this snapshot by the GPU detector: what only a sequence shows
    # (a stall) needs the same watch poll after poll. None: a fresh watch, so this snapshot alone.
    gpu: GpuWatch | None = None
    # How fast the workspace fills, over the last polls (None: one look, as doctor's, has no trend).
    disk_trend: DiskTrend | None = None
    memory_trends: tuple[MemoryTrend, ...] = ()  # each running stage's memory growth, likewise
    # The running training runs' checkpoints as last listed (sizes only), by stage: read apart from the poll.
    checkpoints: tuple[tuple[str, Checkpoints], ...] = ()
    # The serving ports' readings, kept across polls like the GPU watch (None: doctor's one look).
    serving: ServingWatch | None = None
    # The eval runs the snapshot's summaries hold, when the evals feed has read them (None: read here).
    reports_read: tuple[list[EvalRun], list[Finding]] | None = None

    @classmethod
    def of(cls, config: Config, snapshot: Snapshot, budget: DiskBudget | None = None, *,
           environments: tuple[PythonPackages, ...] = (),
           eval_checked: tuple[EvalRun, RunCheck | None] | None = None,
           gpu: GpuWatch | None = None, disk_trend: DiskTrend | None = None,
           memory_trends: tuple[MemoryTrend, ...] = (),
           checkpoints: tuple[tuple[str, Checkpoints], ...] = (),
           serving: ServingWatch | None = None,
           eval_reports: tuple[list[EvalRun], list[Finding]] | None = None) -> DetectorContext:
        """A context on this snapshot, its budget computed unless the caller has it already."""
        return cls(config, snapshot, budget or disk_budget(config, snapshot), environments, eval_checked, gpu,
                   disk_trend, memory_trends, checkpoints, serving, eval_reports)

    @cached_property
    def eval_reports(self) -> tuple[list[EvalRun], list[Finding]]:
        """The eval runs whose summaries the snapshot brought back, and a finding for each that
        cannot be read (read once per poll: the evals feed's, which the eval pane shows)."""
        return self.reports_read if self.reports_read is not None else read_eval_runs(self.snapshot.reports)


Detector = Callable[[DetectorContext], Iterable[Finding]]


class DetectorRegistry:
    """Named detectors, run in the order they were registered, each on its own: one that raises
    is one internal_error finding (the others' findings stand, and the poll goes on)."""

    def __init__(self) -> None:
        self._detectors: dict[str, Detector] = {}

    def register(self, name: str, detector: Detector) -> None:
        if name in self._detectors:
            raise ValueError(f"a detector named {name!r} is registered already")
        self._detectors[name] = detector

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._detectors)

    def run(self, ctx: DetectorContext, only: Iterable[str] | None = None) -> list[Finding]:
        """Every detector's findings (only: those of these detectors)."""
        chosen = self.names if only is None else tuple(only)
        found: list[Finding] = []
        for name in chosen:
            try:
                found.extend(list(self._detectors[name](ctx)))  # list(): a generator raises as it is read
            except Exception as e:  # a detector's bug, or box input it did not expect: one finding, no lost poll
                found.append(internal_error(name, e))
        return found


def internal_error(name: str, e: Exception) -> Finding:
    # No live figure in the text beyond the error's own: the alert stands while the detector fails.
    return Finding(INTERNAL_ERROR, "error", f"internal error in the {name} detector: {type(e).__name__}: "
                   f"{str(e)[:200]} (what it looks for is not checked; please report it)")


def declared_binaries(cfg: Config) -> list[str]:
    """The binaries each poll checks: the [model] settings' (paths), and the browsers that the
    stages driving one look for (names, looked for on the box's PATH)."""
    model = dict(cfg.model)
    return [str(model[k]) for k in BINARY_SETTINGS if model.get(k)] + browser_names(cfg)


def detect(cfg: Config, snap: Snapshot, budget: DiskBudget | None = None) -> list[Finding]:
    """The traps this snapshot shows by itself (SNAPSHOT_TRAPS), through the registry.
    budget: this snapshot's, when the caller has it already."""
    return DETECTORS.run(DetectorContext.of(cfg, snap, budget), only=SNAPSHOT_TRAPS)


def _shared_writers(ctx: DetectorContext) -> Iterator[Finding]:
    """One file written by processes of different groups: two downloads into one file (§3).
    Processes of one group writing one file are a shell and its children sharing an output."""
    snap = ctx.snapshot
    for path, pids in snap.writers:
        procs = [proc for proc in map(snap.process, pids) if proc]
        groups = {proc.pgid for proc in procs}
        if len(groups) > 1:
            newest = max(procs, key=lambda p: (p.start_time, p.pid))
            yield Finding("shared_writer", "error",
                          f"{path} is being written by {len(pids)} processes in {len(groups)} groups "
                          f"(pids {', '.join(map(str, pids))}): two writers corrupt a download",
                          FixAction.kill(newest))


def _serve_ports(ctx: DetectorContext) -> Iterator[Finding]:
    """More than one listener on a serve port, or one the console did not start: a stale server
    answers the health check and takes the eval (§6)."""
    cfg, snap = ctx.config, ctx.snapshot
    for stage in cfg.stages:
        rec = snap.state(stage.name)
        # Its chain's group and every process the chain started, setsid ones included (the box tracks them).
        ours_groups, ours = ({rec.pgid}, set(rec.group)) if rec and rec.alive else (set(), set())
        for port in stage.ports:
            held = [s.pid for s in snap.listeners if s.port == port and s.pid]  # the listeners' pids
            if len(held) > 1:
                yield Finding("port_contended", "error", f"port {port} has {len(held)} listeners "
                              f"(pids {', '.join(map(str, held))})", _kill_action(snap, held[-1]))
            for pid in held:
                proc = snap.process(pid)
                if proc and proc.pgid not in ours_groups and proc.pid not in ours:
                    yield Finding("stale_server", "warning", f"port {port} (stage {stage.name}) is held by pid "
                                  f"{proc.pid} which the console did not start: {proc.command[:80]}",
                                  _kill_action(snap, proc.pid))


def llama_servers(snap: Snapshot) -> Iterator[Process]:
    """The llama-server processes: argv[0] for the binary; argv[1] when an interpreter runs a script of that name."""
    for p in snap.processes:
        if any(posixpath.basename(a) == "llama-server" for a in p.argv[:2]):
            yield p


def _reasoning_format(ctx: DetectorContext) -> Iterator[Finding]:
    """llama-server splitting <think> into reasoning_content: the fake 0 % (§6)."""
    snap = ctx.snapshot
    for p in llama_servers(snap):
        value = reasoning_format(p.argv)
        if value != "none":
            how = "without --reasoning-format (its default splits)" if value is None else \
                f"with --reasoning-format {value[:40]}"
            yield Finding("reasoning_split", "warning", f"llama-server pid {p.pid} runs {how}: an unclosed <think> "
                          "empties content; it needs --reasoning-format none", _kill_action(snap, p.pid))


def _serve_without_mmproj(ctx: DetectorContext) -> Iterator[Finding]:
    """A multimodal pipeline's llama-server without its projector: images fail or are answered blind (§10)."""
    cfg, snap = ctx.config, ctx.snapshot
    artifact = mmproj_artifact(cfg)
    if artifact is None:
        return
    for p in llama_servers(snap):
        if not has_mmproj(p.argv):
            yield Finding("serve_without_mmproj", "error",
                          f"llama-server pid {p.pid} runs without --mmproj, but the pipeline is multimodal "
                          f"([model] mmproj = {artifact.name}, {artifact.path}): image requests will fail or be "
                          "answered blind; serve it with --mmproj", _kill_action(snap, p.pid))


def reasoning_format(argv: Sequence[str]) -> str | None:
    """The value of llama-server's --reasoning-format in argv (the last one wins), None without it."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--reasoning-format":
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith("--reasoning-format="):
            value = arg.split("=", 1)[1]
    return value


# What a rebuilt box has lost when a restore beats rebuilding: the base and the trained adapter.
REBUILT_WITHOUT = ("base", "adapter")


def _restore_instead(ctx: DetectorContext) -> Iterator[Finding]:
    """§4.5: the base and the adapter gone, what the restore stage pulls back pushed and there:
    restore (minutes) instead of rebuilding (downloads and hours of training)."""
    for restore in ctx.config.stages_with_role(Role.RESTORE):
        yield from _restore_one(restore, ctx.snapshot, ctx.budget)


def _restore_one(restore: Stage, snap: Snapshot, budget: DiskBudget) -> Iterator[Finding]:
    record = snap.state(restore.name)
    if not restore.needs or (record is not None and record.alive):
        return

    def present(name: str) -> bool:
        use = budget.artifact(name)
        return use is not None and use.actual is not None

    lost = [name for name in REBUILT_WITHOUT if budget.artifact(name) is not None]
    if lost and not any(map(present, lost)) and all(map(present, restore.needs)) \
            and not any(map(present, restore.makes)):
        yield Finding("restore_available", "warning",
                      f"{' and '.join(lost)} are gone but {', '.join(restore.needs)} was pushed: restore it "
                      f"(key {restore.key}) to serve in minutes instead of rebuilding", FixAction.restart(restore.name))


def _poison(ctx: DetectorContext) -> Iterator[Finding]:
    """What a failed run left that makes the next one refuse (TRAIN_NAN): restart clears it (§9).
    Only after a run that did not end well, and never a good run's outputs (final/, TRAIN_DONE):
    those are the preflight's matter when the stage is about to run again, not an alert."""
    cfg, snap = ctx.config, ctx.snapshot
    for stage in cfg.stages:
        rec = snap.state(stage.name)
        if rec is None or rec.status not in ("failed", "lost", "orphaned"):
            continue
        present = [path for path in present_poison(stage, snap) if path_is_poison(cfg, stage, path)]
        if present:
            yield Finding("poison_files", "warning", f"stage {stage.name}: {', '.join(present)} left by its "
                          f"{rec.status} run; restarting clears them", FixAction.restart(stage.name))


def path_is_poison(cfg: Config, stage: Stage, path: str) -> bool:
    """A poison path that marks a failure, not one of a good run's outputs: neither an artifact
    the stage makes (its adapter) nor named after one of its non-error markers (TRAIN_DONE)."""
    made = {posixpath.normpath(a.path) for a in cfg.artifacts if a.name in stage.makes}
    if posixpath.normpath(path) in made:
        return False
    good = {m.name for m in stage.markers if m.severity != "error"}
    return posixpath.basename(posixpath.normpath(path)) not in good


def _disk(ctx: DetectorContext) -> Iterator[Finding]:
    """The next stage's projected peak above the free space (§4)."""
    cfg, snap, budget = ctx.config, ctx.snapshot, ctx.budget
    for stage in cfg.stages:
        rec = snap.state(stage.name)
        if rec is not None:
            continue  # only the stages still ahead
        p = project(cfg, budget, stage)
        if not p.fits:
            can_clean = p.fits_after_cleaning and budget.reclaimable
            yield Finding("disk_peak", "error" if not can_clean else "warning",
                          f"stage {stage.name} needs {p.adds / 1e9:.1f} GB at its peak, "
                          f"{p.free_now / 1e9:.1f} GB free" + (" (clean intermediates first)" if can_clean else ""),
                          CLEAN if can_clean else None)
        return  # the next stage only


def _disk_reserve(ctx: DetectorContext) -> Iterator[Finding]:
    """Free space on the workspace's disk below the configured reserve, whatever runs next."""
    cfg, budget = ctx.config, ctx.budget
    reserve = int(cfg.budget.reserve_gb * GB)
    if budget.capacity and budget.free < reserve:
        can_clean = budget.reclaimable > 0
        # No live byte count in the text: an alert is the same alert while the condition holds.
        yield Finding("disk_reserve", "error", f"free space on the workspace disk is below the reserve of "
                      f"{units.size(reserve)}" + ("; intermediates can be cleaned" if can_clean else ""),
                      CLEAN if can_clean else None)


def _binaries(ctx: DetectorContext) -> Iterator[Finding]:
    """A declared binary missing or not executable: often a tarball unpacked as bin/bin/ (§3)."""
    snap = ctx.snapshot
    browsers = browser_names(ctx.config)  # any one of them will do: _browser judges them together
    for path, exists, executable in snap.binaries:
        if not executable and path not in browsers:
            what = "is not executable" if exists else "does not exist"
            yield Finding("binary_missing", "error", f"{path} {what} (a tarball with a nested prefix?)")


def _browser(ctx: DetectorContext) -> list[Finding]:
    return browser_missing(ctx.config, ctx.snapshot)


def _lost_stages(ctx: DetectorContext) -> Iterator[Finding]:
    """A stage whose process died without CHAIN_DONE: killed -9, OOM-killed, or the box rebooted."""
    snap = ctx.snapshot
    for rec in snap.states:
        if rec.status in ("lost", "orphaned"):
            action = FixAction.stop(rec.stage) if rec.status == "orphaned" else FixAction.restart(rec.stage)
            yield Finding("stage_lost", "error", f"stage {rec.stage} (pid {rec.pid}) died without CHAIN_DONE"
                          + ("; its group still runs" if rec.status == "orphaned" else ""), action)


def peft_pythons(cfg: Config) -> dict[str, tuple[str, ...]]:
    """The interpreter of each stage that runs peft (the train and merge modules, or a stage of
    that role), as its command names it, with those stages: the environments §9 is about."""
    found: dict[str, tuple[str, ...]] = {}
    for stage in cfg.stages:
        for python in _peft_runners(stage.role, stage.command):
            found[python] = found.get(python, ()) + (stage.name,)
    return found


def _peft_runners(role: Role, command: str) -> list[str]:
    """The pythons in a command that run a peft stage: `venv/bin/python -m samai_box.stages.train`
    (or the old `venv/bin/python "$SAMAI_TOOLS/stages/train.py"`) and any python of a train-role stage."""
    words = command_words(command)
    if words is None:  # unbalanced quotes: the stage cannot run either
        return []
    found: list[str] = []
    for i, word in enumerate(words[:-1]):
        if not PYTHON.match(posixpath.basename(word)) or word in found:
            continue
        script = words[i + 2] if words[i + 1] == "-m" and i + 2 < len(words) else words[i + 1]
        module = script.rsplit(".", 1)[-1] if words[i + 1] == "-m" else posixpath.basename(script).removesuffix(".py")
        if role.runs_peft or module in PEFT_MODULES:
            found.append(word)
    return found


def torchao_beside_peft(cfg: Config, envs: Sequence[PythonPackages]) -> list[Finding]:
    """torchao installed beside peft: peft's LoRA dispatch imports torchao whenever it is
    installed and raises ImportError on a version it does not support (§9: uninstall torchao)."""
    users = peft_pythons(cfg)
    found = []
    for env in envs:
        peft, torchao = env.get("peft"), env.get("torchao")
        if peft is None or torchao is None:
            continue
        stages = users.get(env.python, ())
        used_by = f" (stage {', '.join(stages)})" if stages else ""
        found.append(Finding("torchao_beside_peft", "error",
                             f"torchao {torchao.version[:40]} is installed beside peft {peft.version[:40]} in "
                             f"{env.python}{used_by}: peft's LoRA dispatch imports torchao when it is installed "
                             "and fails with ImportError on a version it does not support (peft 0.19 wants "
                             "torchao >= 0.16); the pipeline does not use torchao: uninstall it",
                             FixAction.uninstall(env.python, "torchao")))
    return found


def eval_findings(run: str, result: RunCheck | None) -> list[Finding]:
    """An eval run's problems, as `check eval` finds them in its items (a fake 0 %, §6)."""
    if result is None:
        return []
    return [Finding(p.code, p.severity, f"eval {run[:60]}: {p.message}") for p in result.problems]


def _kill_action(snap: Snapshot, pid: int) -> FixAction | None:
    proc = snap.process(pid)
    return FixAction.kill(proc) if proc else None


def _torchao(ctx: DetectorContext) -> list[Finding]:
    return torchao_beside_peft(ctx.config, ctx.environments)


def _gpus(ctx: DetectorContext) -> list[Finding]:
    """What the GPUs show. With no watch of its own (doctor) a fresh one sees this snapshot as
    its first reading: everything one reading shows, and no stall (that takes a sequence)."""
    watch = ctx.gpu if ctx.gpu is not None else GpuWatch(ctx.config)
    return watch.findings(ctx.snapshot)


def _serving(ctx: DetectorContext) -> list[Finding]:
    """What the running servers' monitoring answers show (a stall takes the watch's sequence)."""
    watch = ctx.serving if ctx.serving is not None else ServingWatch(ctx.config, one_look=True)
    return watch.findings(ctx.snapshot)


def _not_resumable(ctx: DetectorContext) -> list[Finding]:
    """Each training stage that could not be resumed as its command stands (the fire's preflight
    says it too, with the step rate it last measured)."""
    from samai.console.core.preflight.resumable import CODE, resumable_checks

    return [Finding(CODE, severity, text.removeprefix(f"{CODE}: "))
            for stage in ctx.config.stages for severity, text in resumable_checks(ctx.config, stage)]


def _disk_filling(ctx: DetectorContext) -> list[Finding]:
    running = [r.stage for r in ctx.snapshot.states if r.status == "running"]
    return filling_findings(ctx.disk_trend, running)


def _memory_filling(ctx: DetectorContext) -> list[Finding]:
    mem = ctx.snapshot.memory
    said = f"its memory cgroup's limit ({mem.cgroup})" if mem.limit and mem.ceiling == mem.limit else "the box's RAM"
    return memory_findings(list(ctx.memory_trends), said)


def _checkpoint_space(ctx: DetectorContext) -> list[Finding]:
    return checkpoint_findings(dict(ctx.checkpoints), ctx.snapshot, ctx.budget,
                               int(ctx.config.budget.reserve_gb * GB))


def _unreadable_summaries(ctx: DetectorContext) -> list[Finding]:
    return ctx.eval_reports[1]


def _eval(ctx: DetectorContext) -> list[Finding]:
    return eval_findings(ctx.eval_checked[0].name, ctx.eval_checked[1]) if ctx.eval_checked else []


# What one snapshot shows by itself (`detect`): the first detectors run, in this order.
SNAPSHOT_TRAPS: dict[str, Detector] = {
    "shared_writers": _shared_writers, "serve_ports": _serve_ports, "reasoning_format": _reasoning_format,
    "serve_without_mmproj": _serve_without_mmproj, "poison": _poison, "disk": _disk, "disk_reserve": _disk_reserve,
    "binaries": _binaries, "browser": _browser, "lost_stages": _lost_stages, "restore_instead": _restore_instead,
    "not_resumable": _not_resumable,
}


# What a fleet row's poll judges (ConsoleState's row_only): what its slim snapshot shows, without
# the process table, the serving ports, the report files or the binaries, which it does not ask for.
ROW_DETECTORS = ("poison", "disk", "disk_reserve", "lost_stages", "restore_instead", "gpus", "disk_filling",
                 "memory_filling")

# The detectors of what is read apart from the poll: judged again when it has been read.
ENVIRONMENT_DETECTORS = ("torchao_beside_peft",)
EVAL_DETECTORS = ("eval",)
CHECKPOINT_DETECTORS = ("checkpoint_space",)


def _registry() -> DetectorRegistry:
    registry = DetectorRegistry()
    for name, detector in {**SNAPSHOT_TRAPS, ENVIRONMENT_DETECTORS[0]: _torchao, "gpus": _gpus, "serving": _serving,
                           "disk_filling": _disk_filling, "memory_filling": _memory_filling,
                           CHECKPOINT_DETECTORS[0]: _checkpoint_space,
                           "unreadable_summaries": _unreadable_summaries,
                           EVAL_DETECTORS[0]: _eval}.items():
        registry.register(name, detector)
    return registry


DETECTORS = _registry()  # what `doctor` and the TUI's state run
