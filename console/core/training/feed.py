"""The training feed: the training (role train) stage's run as its log shows it and as the box
keeps it.

- its log followed in the poll: the curve's points (one run: a new run starts it again, a
  resumed one goes on from the runs it continues), the log's anomalies (NaN, hidden NaN...) as
  alerts at once;
- beside the poll: the run's reference (the last good run of its stage, read from the kept logs
  at the first poll and after each new run; or one the operator picked), drawn beside the curve
  and compared with the run (worse_than_reference); a resumed run's earlier curve; a running
  run's checkpoints, listed every CHECKPOINT_READ_S (checkpoint_space: does the next one fit); a
  resumed run's dead run's steps after the resume, which the resumed run must log again with the
  same losses (resume_diverged: console/core/training/fidelity.py);
  and for a run that died, the checkpoint it would resume from (the same choice `x`, `doctor`
  and the watcher's resume_train make), said as resume_available."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samai.console.core.alertbook import Alert
from samai.console.core.checks import Unreadable
from samai.console.core.chunked_lines import piece_follower
from samai.console.core.disk.trends import CHECKPOINT_READ_S
from samai.console.core.feeds import Feed, Poll, Read, Surroundings
from samai.console.core.fixes import FixAction
from samai.console.core.roles import Role
from samai.console.core.training.fidelity import first_divergence
from samai.console.core.training.resume import ResumeChoice
from samai.console.core.training.trainlog import TrainLogCheck, TrainPoint, newest_run_points
from samai.console.core.training.trainref import CODE, Reference, ReferenceCurve, ReferenceWatch
from samai.remote.follow import LogFollower
from samai.remote.model import Checkpoints

if TYPE_CHECKING:
    from samai.console.core.config import Stage
    from samai.remote.boxapi import Box

RESUME_AVAILABLE = "resume_available"
DEAD = ("failed", "lost", "orphaned")  # how a run ends that its checkpoints can take up again


@dataclass(frozen=True)
class TrainingView:
    """What the curves pane is handed: what is new since the last update."""

    new_points: list[TrainPoint]
    new_evals: list[tuple[int, float]]  # the train log's eval losses, (step, loss)
    reset: bool = False  # a new training run: the curve starts again
    resumed_at: int | None = None  # the run resumed from this step: the curve goes on from the last run's
    reference: ReferenceCurve | None = None  # the run's reference, when it was (re)read
    before: list[TrainPoint] | None = None  # a resumed run's earlier points, when they were read


class TrainingFeed(Feed):
    name = "training"
    detectors = ("checkpoint_space",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        train = self.config.stage_by_role(Role.TRAIN)  # the stage whose log the curve and its alerts come from
        self.stage = train.name if train else None
        self.log = piece_follower(self.config.path_of(train.log), offset=0) if train and not state.row_only else None
        self.check = TrainLogCheck()  # the same reader as `check trainlog`
        self.reference = ReferenceWatch(self.config.train)  # the last good run the followed one is compared with
        self.checkpoint_lists: dict[str, Checkpoints] = {}  # each running training run's, as last listed
        self._checkpoints_asked: dict[str, float] = {}
        self._resumed_at: int | None = None  # the followed run's resume step, once said
        self._reference_due = self.log is not None
        self._earlier_due: int | None = None  # the resume step whose earlier curve is to be read
        self._dead_due: int | None = None  # the resume step after which the dead run's steps are to be read
        self._dead: tuple[int, list[TrainPoint]] | None = None  # (resume step, the dead run's points after it)
        self._fidelity_settled = False  # resume_diverged said, or every step of the dead run compared
        self._resume_read: dict[str, float] = {}  # each dead run (fired_at) whose checkpoint was chosen
        self.choices: dict[str, ResumeChoice] = {}  # each dead run's choice, by stage (doctor lists them)
        self._view: TrainingView | None = None
        self._paced: tuple[tuple[float, int], tuple[float, int]] | None = None  # (when, step): the run's first and last
        self._multi_node = bool(train and train.nodes)  # rank 0's curve comes from the nodes feed

    # ------------------------------------------------------------ the poll

    def followers(self) -> list[LogFollower]:
        return [self.log] if self.log else []

    def fold(self, poll: Poll) -> list[Alert]:
        reset = False
        if self.stage in poll.new_runs and self.log is not None:
            self.log = piece_follower(self.log.path, offset=0)
            self.check, self._resumed_at = TrainLogCheck(), None
            self._dead, self._fidelity_settled, self._paced = None, False, None
            self.reference.new_run()
            self._reference_due, reset = True, True
        chunk = poll.chunks.get(id(self.log)) if self.log is not None else None
        if self.log is None or chunk is None:
            self._view = TrainingView([], [], reset) if reset else None
            return []
        tail = self.log.consume(chunk)
        self.check, restarted, points = newest_run_points(self.check, tail.lines, tail.first_line)
        reset |= restarted
        resumed, said = self.check.resumed_from, None
        if resumed is not None and (restarted or resumed != self._resumed_at):
            said = self._earlier_due = self._dead_due = resumed  # said once per run
        self._resumed_at = resumed
        self._reference_due |= restarted
        name = self.stage or ""
        alerts = [self.state.run_alert(name, a.severity, f"{name}: {a.message}", a.code)
                  for a in self.check.drain_anomalies()]
        alerts += self._worse() + self._diverged() if points else []
        if points:
            seen = (poll.now, points[-1].step)
            self._paced = (self._paced[0] if self._paced else seen, seen)
        if self._multi_node:  # the curve is rank 0's, whichever box it runs on
            points, reset = [], False
        self._view = TrainingView(points, self.check.drain_evals(), reset, said)
        return alerts

    def step_rate(self) -> float | None:
        """The followed run's optimizer steps a second, as its log showed them arrive (None: not yet)."""
        if self._paced is None:
            return None
        (t0, s0), (t1, s1) = self._paced
        return (s1 - s0) / (t1 - t0) if t1 - t0 >= 10.0 and s1 > s0 else None

    def unproven(self) -> bool:
        """Whether the followed run's log has an error-level finding (what it made is not to be taken on)."""
        return any(a.severity == "error" for a in self.check.anomalies)

    def _worse(self) -> list[Alert]:
        worse = self.reference.check(self.check.parser.points)
        name = self.stage or ""
        return [self.state.run_alert(name, "warning", f"{name}: {worse.problem().message}", CODE)] if worse else []

    # ------------------------------------------------------------ beside the poll

    def reads(self, now: float) -> list[Read]:
        due: list[Read] = []
        if self.log is not None and self._reference_due:
            self._reference_due = False
            due.append(Read("the training run's reference", self._last_good_run,
                            lambda reference, now: self.set_reference(reference)))
        if self.log is not None and self._earlier_due is not None:
            step, self._earlier_due = self._earlier_due, None
            due.append(self._earlier_curve(step))
        if self.log is not None and self._dead_due is not None:
            step, self._dead_due = self._dead_due, None
            due.append(self._dead_run(step))
        due += self._checkpoint_reads(now) + self._resume_reads()
        return due

    def _dead_run(self, step: int) -> Read:
        """The steps the run this one resumed logged after `step`: this run must log the same losses."""
        async def fetch(box: Box) -> list[TrainPoint]:
            from samai.console.core.training.lineage import dead_run_points

            assert self.log is not None
            try:
                return await dead_run_points(box, self.log.path, step)
            except Unreadable:
                return []

        def read(points: list[TrainPoint], now: float) -> list[Alert]:
            self._dead = (step, points)
            return self._diverged()

        return Read("the steps the resumed run's dead run logged", fetch, read)

    def _diverged(self) -> list[Alert]:
        """resume_diverged, once per run: the resumed run off its dead run's loss at a step both logged."""
        if self._dead is None or self._fidelity_settled:
            return []
        step, dead = self._dead
        points = self.check.parser.points
        found = first_divergence(points, dead, self.config.train.resume_tolerance, step)
        if found is None:
            # past the dead run's last step, nothing is left to compare
            self._fidelity_settled = bool(dead and points and points[-1].step >= dead[-1].step)
            return []
        self._fidelity_settled = True
        name, finding = self.stage or "", found.finding()
        return [self.state.run_alert(name, finding.severity, f"{name}: {finding.message}", finding.code)]

    async def _last_good_run(self, box) -> Reference | None:
        from samai.console.core.training.trainref import last_good_run

        assert self.log is not None
        try:
            return await last_good_run(box, self.log.path, self.config.train)
        except Unreadable:
            return None

    def set_reference(self, reference: Reference | None, picked: bool = False) -> list[Alert]:
        """The followed run's reference (the last good run of its stage, or one the operator picked:
        then the run is compared anew), drawn beside the curve and compared with the run at once."""
        self.reference.set(reference)
        if picked:
            self.reference.new_run()
        self._view = TrainingView([], [], reference=self.reference.curve())
        return self._worse()

    def _earlier_curve(self, step: int) -> Read:
        async def fetch(box: Box) -> list[TrainPoint]:
            from samai.console.core.training.lineage import earlier_points

            assert self.log is not None
            try:
                return await earlier_points(box, self.log.path, step)
            except Unreadable:
                return []

        return Read("the resumed run's earlier curve", fetch, self._earlier_read)

    def _earlier_read(self, points: list[TrainPoint], now: float) -> list[Alert]:
        self._view = TrainingView([], [], before=points)
        return []

    def _checkpoint_reads(self, now: float) -> list[Read]:
        """The running train stages whose checkpoints are to be listed again (each once every CHECKPOINT_READ_S)."""
        snap = self.state.snapshot
        due = [s for s in self.config.stages if s.role.resumable and s.checkpoints and snap
               and (rec := snap.state(s.name)) is not None and rec.status == "running"
               and now - self._checkpoints_asked.get(s.name, float("-inf")) >= CHECKPOINT_READ_S]
        self._checkpoints_asked.update((s.name, now) for s in due)
        return [self._listing(s.name, s.checkpoints or "") for s in due]

    def _listing(self, stage: str, folder: str) -> Read:
        async def fetch(box: Box) -> Checkpoints:
            return await box.checkpoints(folder, weights=False)

        def listed(found: Checkpoints, now: float) -> list[Alert]:
            self.checkpoint_lists[stage] = found
            return []

        return Read(f"{stage}'s checkpoints", fetch, listed)

    def _resume_reads(self) -> list[Read]:
        """The train stages whose last run died and kept checkpoints: the checkpoint it would
        resume from, chosen once per run."""
        snap = self.state.snapshot
        if snap is None:
            return []
        due = [(s, rec) for s in self.config.stages if s.role.resumable and s.checkpoints
               and (rec := snap.state(s.name)) is not None and rec.status in DEAD
               and self._resume_read.get(s.name) != rec.fired_at]
        self._resume_read.update((s.name, rec.fired_at) for s, rec in due)
        return [self._resume_choice(s, rec.fired_at) for s, rec in due]

    def _resume_choice(self, stage: Stage, run: float) -> Read:
        async def fetch(box: Box) -> ResumeChoice | None:
            from samai.console.core.training.resume import NothingToResume, resume_choice

            try:
                return await resume_choice(box, self.config, stage)
            except NothingToResume:
                return None

        return Read(f"the checkpoint {stage.name} would resume from", fetch,
                    lambda choice, now: self._chosen(stage, run, choice, now))

    def _chosen(self, stage: Stage, run: float, choice: ResumeChoice | None, now: float) -> list[Alert]:
        if choice is None or choice.chosen is None:
            return []
        self.choices[stage.name] = choice
        death = next((a for a in self.state.book.active() if a.stage == stage.name and a.run == run
                      and a.severity == "error"), None)
        cause = f" ({death.text.split(': ', 1)[-1][:80]})" if death else ""
        text = (f"stage {stage.name} died{cause}; it can resume from {choice.path} (step {choice.chosen.step}) "
                f"instead of step 0: x resumes it")
        if self.state.book.standing(RESUME_AVAILABLE, text):
            return []
        return [Alert(now, "info", text, stage.name, "x resume", RESUME_AVAILABLE, FixAction.resume(stage.name),
                      run=run)]

    def context(self) -> dict[str, Any]:
        return {"checkpoints": tuple(self.checkpoint_lists.items())}

    def view(self) -> TrainingView | None:
        view, self._view = self._view, None
        return view
