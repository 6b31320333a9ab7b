"""Training points and training anomalies from whatever the box's training log holds, incrementally.

Read:
- HF Trainer log dicts, transformers 4 (`{'loss': 1.0778, 'grad_norm': nan, ...}`) and 5
  (`{'loss': '0.8897', ...}`), with `nan`/`inf`/`-inf` and `tensor(1.23, device='cuda:0')`;
  the final `{'train_runtime': ..., 'train_loss': ...}` dict is the run's summary, eval dicts
  (`eval_*`) are neither steps nor unparsed;
- trainer_state.json's `log_history` (bare `NaN`/`Infinity`, or `nan`/`inf`, allowed);
- DeepSpeed: `steps: N loss: X ...`, `step=N, skipped=S, ...`, `OVERFLOW! ... Skipping step.
  Attempted loss scale: A, reducing to B`, `Current loss scale already at minimum`;
- torch's `Attempting to unscale FP16 gradients`, the NaN guard's `TRAIN_NAN ...` marker, and the
  train stage's `TRAIN_RESUMED from CHECKPOINT (step N)`: the next step without one is N + 1 (a
  resumed run's steps are the run's global steps, continuing the run it resumed).

A line may hold many tqdm `\\r` segments; each is read. Lines without a step get the next one
in order. Nothing raises on garbage: lines that hold nothing known are counted as unparsed.

Memory is bounded whatever the log holds (a 1 GB log of millions of steps, a line of megabytes,
garbage): the points kept are thinned evenly past MAX_POINTS, each anomaly code is listed up to
MAX_REPORTS times and counted after, a trainer_state.json is decoded one log_history entry at a
time, and a long line is read in pieces (longlines). The anomalies, the summary and the counts
are found over every line, so they are exact. `check trainlog` and the training pane read with
the same TrainLogCheck.

The anomaly codes and severities below are a contract (scripts and tests match on them)."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import re
import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from samai.console.core.chunked_lines import PieceDecoder
from samai.console.core.problems import Problem, has_errors  # noqa: F401 (checkers' callers import has_errors here)
from samai.remote.follow import new_run
from samai.remote.model import Severity

FIELDS = ("loss", "grad_norm", "learning_rate", "epoch")
ERROR: Severity = "error"
WARNING: Severity = "warning"

SEVERITY: dict[str, Severity] = {
    "nan_loss": ERROR,
    "nan_grad_norm": ERROR,
    "hidden_nan": ERROR,  # loss 0 while grad_norm is nan/inf: the Trainer's nan filter at work
    "zero_loss_streak": WARNING,
    "dead_gradients": ERROR,  # grad_norm exactly 0 step after step: nothing is being trained
    "not_learning": ERROR,  # the loss flat for most of the run: the weights do not move, or do not matter
    "loss_spike": WARNING,
    "overflow_skip": WARNING,
    "loss_scale_min": ERROR,
    "unscale_fp16": ERROR,
    "nan_guard_fired": ERROR,
    "no_training_data": ERROR,  # a one-shot check found no step, summary or event at all: wrong file?
}
EVENT_CODES = frozenset({"overflow_skip", "loss_scale_min", "unscale_fp16", "nan_guard_fired"})

ZERO_STREAK = 3  # logged steps in a row with loss exactly 0
SPIKE_WINDOW, SPIKE_MIN_HISTORY = 10, 3  # finite losses the median is taken over (at least 3)
SPIKE_FACTOR, SPIKE_MARGIN = 3.0, 1.0  # above 3x that median AND more than 1.0 above the last
DEAD_STREAK = 5  # logged steps in a row with grad_norm exactly 0 (the train stage's --nan-patience default)
FLAT_MIN, FLAT_SHARE = 10, 0.75  # a flat loss over at least 10 logged steps and 3/4 of the run so far
FLAT_REL_TOL, FLAT_ABS_TOL = 1e-4, 1e-6  # "flat": within 0.01 % of where the flat stretch began
OVERFLOW_STREAK = 5  # skipped steps in a row worth a second warning
STATE_PEEK = 64  # first lines looked at to tell a trainer_state.json from a log
STATE_PEEK_CHARS = 64 * 1024  # and at most this much of them (a trainer_state.json names log_history early)
MAX_EVALS = 1000  # eval losses kept (a run evaluates far less often than it logs a step)
MAX_POINTS = 2048  # points a result keeps: beyond that the series is thinned evenly (anomalies see every one)
MAX_PINNED = 256  # points kept whatever the thinning: those an anomaly was reported at
MAX_REPORTS = 100  # reports of one code listed (a noisy run spikes thousands of times); the rest are counted
READ = 4 * 1024 * 1024  # one read of a local log
BATCH = 4096  # lines handed over one at a time are read in batches of this many
# A line that names none of these holds nothing read here.
NAMES = ("loss", "FP16", "TRAIN_NAN", "TRAIN_RESUMED", "skipped=")
MAX_ENTRY = 64 * 1024  # characters one log_history entry of a trainer_state.json may take

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_DICT = re.compile(r"\{[^{}]*\}")
# a value: tensor(1.2, device='cuda:0') or np.float64(1.2), 'quoted', "quoted", or bare (nan, 1e-05)
_PAIR = re.compile(r"""['"](\w+)['"]\s*:\s*"""
                   r"""(?:[\w.]+\(\s*([^,()\s]+)[^()]*\)|'([^']*)'|"([^"]*)"|([^,}\s]+))""")
_DS_STEPS = re.compile(r"\bsteps:\s*(\d+)\s+loss:\s*([^\s,]+)")
_DS_PROGRESS = re.compile(r"\bstep=(\d+),\s*skipped=(\d+)")
_DS_OVERFLOW = re.compile(r"Attempted loss scale:\s*(\d[\d.eE+]*)(?:,\s*reducing to\s*(\d[\d.eE+]*))?")
TRAIN_RESUMED = re.compile(r"^TRAIN_RESUMED\b.*\(step (\d{1,12})\)\s*$")  # the train stage's, on resuming
_NAN_MARKER = re.compile(r"^[\s\d:\-T.,+/|]*(?:\[[^\]]*\][\s:]*)*TRAIN_NAN\b[\s:]*(.*)")
_BARE_NON_FINITE = re.compile(r"(:\s*|\[\s*|,\s*)(-?)(nan|inf(?:inity)?)\b", re.IGNORECASE)
_HISTORY = re.compile(r'"log_history"\s*:\s*\[')

GivenState = str | Mapping[str, Any] | os.PathLike  # a trainer_state.json given beside a log


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class TrainPoint:
    step: int
    loss: float | None
    grad_norm: float | None = None
    learning_rate: float | None = None
    epoch: float | None = None

    @property
    def hidden_nan(self) -> bool:
        """Loss 0 while grad_norm is not finite: the Trainer replaced a NaN loss (logging_nan_inf_filter)."""
        return self.loss == 0 and self.grad_norm is not None and not math.isfinite(self.grad_norm)

    @property
    def bad(self) -> bool:
        """NaN/inf anywhere, or a hidden NaN."""
        values = (self.loss, self.grad_norm, self.learning_rate, self.epoch)
        return self.hidden_nan or any(v is not None and not math.isfinite(v) for v in values)

    def to_json(self) -> dict[str, Any]:
        """NaN and inf become null (JSON has neither); the anomalies say which they were."""
        return {"step": self.step, **{name: _finite_or_none(getattr(self, name)) for name in FIELDS}}


@dataclass(frozen=True)
class TrainLogResult:
    """A training log's check: its points (NaN/inf kept; evenly thinned past MAX_POINTS, see
    PointSeries), its anomalies (`problems`, each at its step, found over every point), the run's
    summary dict when it logged one, the lines read and not understood, and the steps read."""

    points: tuple[TrainPoint, ...]
    problems: tuple[Problem, ...]
    summary: dict[str, float | None] | None
    lines: int
    unparsed: int
    steps: int = 0  # every training point read: more than len(points) once they are thinned

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON: NaN/inf are null, and the anomalies say which they were."""
        summary = None if self.summary is None else {k: _finite_or_none(v) for k, v in self.summary.items()}
        return {"points": [p.to_json() for p in self.points],
                "anomalies": [_anomaly_json(a) for a in self.problems],
                "summary": summary, "lines": self.lines, "unparsed": self.unparsed, "steps": self.steps}


def _anomaly_json(anomaly: Problem) -> dict[str, Any]:
    return {"code": anomaly.code, "severity": anomaly.severity, "step": anomaly.step, "message": anomaly.message}


def _anomaly(code: str, step: int | None, message: str) -> Problem:
    return Problem(code, SEVERITY[code], message, step=step)


def _number(text: Any) -> float | None:
    """A float from a number or its text (nan/inf included), else None."""
    if text is None or isinstance(text, bool):
        return None
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _show(value: float | None) -> str:
    """A value for a message: nan/inf spelt out, numbers to 4 significant digits."""
    return "none" if value is None else f"{value:.4g}"


def _as_step(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


# ------------------------------------------------------------------ point anomalies


class PointWatch:
    """Anomalies a sequence of training points shows, checked one point at a time.

    nan_loss, nan_grad_norm, hidden_nan, zero_loss_streak, dead_gradients and not_learning are
    reported once per run (the curves pane marks every bad step); each loss spike is its own event.
    A run's flatline is judged over the whole run, step by step: the early steps prove nothing."""

    def __init__(self) -> None:
        self._reported: set[str] = set()
        self._zero_run: tuple[int, int] | None = None  # (first step, length) of loss-exactly-0 points in a row
        self._dead_run: tuple[int, int] | None = None  # the same for grad_norm exactly 0
        self._seen = 0
        self._flat_from: TrainPoint | None = None  # the first point of the current flat stretch
        self._flat_len = 0
        self._recent: deque[float] = deque(maxlen=SPIKE_WINDOW)

    def check(self, point: TrainPoint) -> list[Problem]:
        self._seen += 1
        found = [*self._non_finite(point), *self._zero_streak(point), *self._dead(point), *self._flat(point),
                 *self._spike(point)]
        if point.loss is not None and math.isfinite(point.loss) and not point.bad:
            self._recent.append(point.loss)
        return found

    def _once(self, code: str, step: int, message: str) -> list[Problem]:
        if code in self._reported:
            return []
        self._reported.add(code)
        return [_anomaly(code, step, message)]

    def _non_finite(self, p: TrainPoint) -> list[Problem]:
        if p.hidden_nan:
            return self._once("hidden_nan", p.step,
                              f"loss 0 with grad_norm {_show(p.grad_norm)} at step {p.step} (grad_norm shown as "
                              "null): the Trainer's nan filter replaced a NaN loss; the run is not learning")
        found = []
        if p.loss is not None and not math.isfinite(p.loss):
            found += self._once("nan_loss", p.step,
                                f"loss is {_show(p.loss)} at step {p.step} (shown as null)")
        if p.grad_norm is not None and not math.isfinite(p.grad_norm):
            found += self._once("nan_grad_norm", p.step,
                                f"grad_norm is {_show(p.grad_norm)} at step {p.step} (shown as null): gradients "
                                "overflow; with fp16 use bf16 or fp32 instead (playbook §9)")
        return found

    def _zero_streak(self, p: TrainPoint) -> list[Problem]:
        self._zero_run = _streak(self._zero_run, p, p.loss == 0)
        if self._zero_run is None or self._zero_run[1] < ZERO_STREAK:
            return []
        first = self._zero_run[0]
        return self._once("zero_loss_streak", first,
                          f"loss exactly 0 for {ZERO_STREAK} logged steps in a row from step {first}: "
                          "a hidden NaN or labels that mask everything out")

    def _dead(self, p: TrainPoint) -> list[Problem]:
        self._dead_run = _streak(self._dead_run, p, p.grad_norm == 0)
        if self._dead_run is None or self._dead_run[1] < DEAD_STREAK:
            return []
        first = self._dead_run[0]
        return self._once("dead_gradients", first,
                          f"grad_norm exactly 0 for {DEAD_STREAK} logged steps in a row from step {first}: "
                          "no gradient reaches the trained weights (frozen or cut-off adapter); "
                          "the run is not learning")

    def _flat(self, p: TrainPoint) -> list[Problem]:
        if p.loss is None or not math.isfinite(p.loss):
            self._flat_from, self._flat_len = None, 0
            return []
        start = self._flat_from
        if (start is None or start.loss is None
                or abs(p.loss - start.loss) > max(FLAT_ABS_TOL, FLAT_REL_TOL * abs(start.loss))):
            self._flat_from, self._flat_len = p, 1
            return []
        self._flat_len += 1
        if self._flat_len < FLAT_MIN or self._flat_len < FLAT_SHARE * self._seen:
            return []
        return self._once("not_learning", start.step,
                          f"loss flat at {_show(start.loss)} for {self._flat_len} of {self._seen} logged steps "
                          f"(from step {start.step}): the run is not learning")

    def _spike(self, p: TrainPoint) -> list[Problem]:
        if p.loss is None or not math.isfinite(p.loss) or len(self._recent) < SPIKE_MIN_HISTORY:
            return []
        median, previous = statistics.median(self._recent), self._recent[-1]
        if p.loss <= SPIKE_FACTOR * median or p.loss <= previous + SPIKE_MARGIN:
            return []
        factor = f"{p.loss / median:.1f}x" if median > 0 else "far above"
        return [_anomaly("loss_spike", p.step,
                         f"loss jumped to {_show(p.loss)} at step {p.step}: {factor} the median "
                         f"{_show(median)} of the previous {len(self._recent)} logged losses")]


def _streak(run: tuple[int, int] | None, p: TrainPoint, holds: bool) -> tuple[int, int] | None:
    """A streak's (first step, length) once p is counted: two ints however long it runs."""
    if not holds:
        return None
    return (p.step, 1) if run is None else (run[0], run[1] + 1)


# ------------------------------------------------------------------ the points kept


class PointSeries:
    """The points kept of a run of any length: all of them up to `limit`, then every 2nd, every
    4th ... (the stride doubles each time the series fills up again), plus the last point and up
    to MAX_PINNED points an anomaly was reported at. Ten million steps keep a few thousand points;
    the anomalies are found over every point before thinning."""

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self.limit = limit
        self.seen = 0  # points added
        self.stride = 1
        self._kept: list[tuple[int, TrainPoint]] = []  # (index among all points added, point)
        self._pinned: list[tuple[int, TrainPoint]] = []
        self._last: tuple[int, TrainPoint] | None = None

    def add(self, point: TrainPoint, pinned: bool = False) -> None:
        index, self.seen = self.seen, self.seen + 1
        self._last = (index, point)
        if pinned and len(self._pinned) < MAX_PINNED:
            self._pinned.append((index, point))
        elif index % self.stride == 0:
            self._kept.append((index, point))
            if len(self._kept) > self.limit:
                self.stride *= 2
                self._kept = [kept for kept in self._kept if kept[0] % self.stride == 0]

    @property
    def last(self) -> TrainPoint | None:
        return self._last[1] if self._last else None

    def points(self) -> list[TrainPoint]:
        """The points kept, in the order they came."""
        chosen = dict(self._kept)
        chosen.update(self._pinned)
        if self._last is not None:
            chosen[self._last[0]] = self._last[1]
        return [chosen[index] for index in sorted(chosen)]


# ------------------------------------------------------------------ the parser


class TrainLogParser:
    """Feed it log lines as they arrive: `feed` returns the new points; `drain_anomalies`
    returns the anomalies found since its last call (all of them stay in `anomalies`, at most
    MAX_REPORTS of a code and a note of the rest). Memory is bounded whatever the log holds:
    the points kept are a PointSeries, the streaks and the spike window a few numbers.

    overlay: a trainer_state.json's exact points (sorted by step), merged into the stream as it
    comes: each replaces the log's point of its step, the others go in before the first later step."""

    def __init__(self, overlay: Iterable[TrainPoint] = ()) -> None:
        self.series = PointSeries()
        self.anomalies: list[Problem] = []
        self.summary: dict[str, float | None] | None = None
        self.lines = 0
        self.unparsed = 0
        self.overflow_skips = 0
        self._drained = 0
        self._watch = PointWatch()
        self._announced: int | None = None  # a step DeepSpeed's progress line named, not yet logged
        self.resumed_from: int | None = None  # the checkpoint step the run resumed from (TRAIN_RESUMED)
        self._events_reported: set[str] = set()
        self._overflow_run = 0
        self._overflow_last_step: int | None = None
        self._new: list[TrainPoint] = []  # the points of the feed under way
        self._reports: dict[str, int] = {}  # reports made of each code, listed or not
        self._notes: dict[str, int] = {}  # where in anomalies the note of a code's unlisted reports is
        self._overlay = {p.step: p for p in overlay}
        self._overlay_steps = sorted(self._overlay)
        self._overlay_at = 0  # the next overlay step not yet in the stream
        self.evals: list[tuple[int, float]] = []  # (step, eval_loss) of the eval dicts, the last MAX_EVALS
        self._new_evals: list[tuple[int, float]] = []

    # -------------------------------------------------------------- public

    @property
    def points(self) -> list[TrainPoint]:
        """The points kept (all of them up to MAX_POINTS)."""
        return self.series.points()

    def feed(self, lines: Iterable[str]) -> list[TrainPoint]:
        """The new points in lines (kept in self.series); new anomalies go to self.anomalies."""
        self._new = []
        if isinstance(lines, list):
            self._feed_batch(lines)
        else:
            lines = iter(lines)
            while batch := list(itertools.islice(lines, BATCH)):
                self._feed_batch(batch)
        return self._new

    def _feed_batch(self, batch: list[str]) -> None:
        """Only the lines that name a record or an event are read, found by a search of the whole
        batch (most of a log is progress noise: a test per line would cost several times more)."""
        known = sum(self._read_line(batch[i]) for i in _named_lines(batch))
        blank = batch.count("") + sum(map(str.isspace, batch))
        self.lines += len(batch)
        self.unparsed += len(batch) - blank - known

    def feed_state(self, entries: Iterable[Any]) -> list[TrainPoint]:
        """The new points in trainer_state.json log_history entries (each one counts as a line)."""
        self._new = []
        for entry in entries:
            self.lines += 1
            values = {str(k): _number(v) for k, v in entry.items()} if isinstance(entry, Mapping) else {}
            if not self._take_record(values):
                self.unparsed += 1
        return self._new

    def drain_anomalies(self) -> list[Problem]:
        """Anomalies found since the last call: each one is handed out once."""
        new = self.anomalies[self._drained:]
        self._drained = len(self.anomalies)
        return new

    def finish(self) -> list[TrainPoint]:
        """The overlay's points after the log's last step (at the end of the log)."""
        self._new = []
        self._overlay_until(math.inf)
        return self._new

    def result(self) -> TrainLogResult:
        """What was read so far, as a check's result."""
        summary = None if self.summary is None else dict(self.summary)
        return TrainLogResult(tuple(self.points), tuple(self._with_totals()), summary, self.lines, self.unparsed,
                              self.series.seen)

    def _with_totals(self) -> list[Problem]:
        """anomalies, each code's note of unlisted reports giving the exact total so far."""
        anomalies = list(self.anomalies)
        for code, at in self._notes.items():
            note = anomalies[at]
            anomalies[at] = replace(note, count=self._reports[code],
                                    message=f"{self._reports[code]} {code} findings in all: the first "
                                            f"{MAX_REPORTS} are listed, the rest counted")
        return anomalies

    # -------------------------------------------------------------- lines and segments

    def _read_line(self, line: str) -> bool:
        """Whether the line (one that names a record or an event) held anything known."""
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        known = False
        for segment in line.split("\r"):  # tqdm redraws with \r: each segment is its own text
            known = self._read_segment(segment) or known
        return known

    def _read_segment(self, seg: str) -> bool:
        """Literal tests first: a regex runs only on a segment that names what it looks for."""
        if "Skipping step" in seg and ("OVERFLOW" in seg or "overflow" in seg):  # DeepSpeed's, apex's
            return self._overflow(seg)
        if "already at minimum" in seg:
            return self._event("loss_scale_min", self._next_step(),
                               "DeepSpeed's fp16 loss scale is at its minimum and the run exits: "
                               "fp16 keeps overflowing; train in bf16 or fp32 (playbook §9)")
        if "unscale FP16" in seg:
            return self._event("unscale_fp16", self._next_step(),
                               "Attempting to unscale FP16 gradients: the fp16 GradScaler on a frozen base "
                               "with fp16 trainable weights; train in bf16 or fp32 (playbook §9)")
        if "TRAIN_NAN" in seg and self._nan_marker(seg):
            return True
        if seg.startswith("TRAIN_RESUMED"):
            return self._resumed(seg)
        if "loss" in seg and "{" in seg and self._trainer_dicts(seg):
            return True
        if "steps:" in seg and self._deepspeed_steps(seg):
            return True
        return "skipped=" in seg and self._deepspeed_progress(seg)

    # -------------------------------------------------------------- record kinds

    def _trainer_dicts(self, seg: str) -> bool:
        known = False
        for found in _DICT.finditer(seg):
            known = self._take_record(_dict_values(found.group())) or known
        return known

    def _take_record(self, values: dict[str, float | None]) -> bool:
        """A logged dict: a training step, the run's summary or an eval; False if none of those."""
        if any(key.startswith("eval_") for key in values):
            self._eval(values)
            return True  # eval results are not training steps
        if "loss" not in values and ("train_runtime" in values or "train_loss" in values):
            self.summary = values
            return True
        if values.get("loss") is None:
            return False
        step = _as_step(values.get("step"))
        self._add_point(TrainPoint(step if step is not None else self._next_step(),
                                   *(values.get(name) for name in FIELDS)))
        return True

    def _deepspeed_steps(self, seg: str) -> bool:
        found = _DS_STEPS.search(seg)
        loss = _number(found.group(2)) if found else None
        if found is None or loss is None:
            return False
        self._add_point(TrainPoint(int(found.group(1)), loss))
        return True

    def _deepspeed_progress(self, seg: str) -> bool:
        """`step=N, skipped=S`: step N ran; the next dict without a step is step N."""
        found = _DS_PROGRESS.search(seg)
        if not found:
            return False
        self._announced = int(found.group(1))
        return True

    def _overflow(self, seg: str) -> bool:
        found = _DS_OVERFLOW.search(seg)
        step = self._next_step()
        self.overflow_skips += 1
        in_a_row = self._overflow_last_step is not None and step <= self._overflow_last_step + 1
        self._overflow_run = self._overflow_run + 1 if in_a_row else 1
        self._overflow_last_step = step
        scale = ""
        if found:
            attempted, reduced = (g.rstrip(".") if g else g for g in found.groups())
            scale = f" (loss scale {attempted}" + (f" → {reduced})" if reduced else ")")
        if self.overflow_skips == 1:
            self._report(_anomaly("overflow_skip", step,
                                  f"step {step} skipped on an fp16 overflow{scale}; a few while "
                                  "the loss scale settles are normal"))
        if self._overflow_run == OVERFLOW_STREAK:
            self._report(_anomaly("overflow_skip", step,
                                  f"{OVERFLOW_STREAK} steps in a row skipped on fp16 overflow up to step {step}"
                                  f"{scale}, {self.overflow_skips} skipped so far: the run may not be learning; "
                                  "bf16 or fp32 avoid it (playbook §9)"))
        return True

    def _resumed(self, seg: str) -> bool:
        """The run continues from a checkpoint of step N: its next step is N + 1."""
        found = TRAIN_RESUMED.match(seg)
        if found:
            self.resumed_from = int(found.group(1))
            self._announced = self.resumed_from + 1
        return bool(found)

    def _nan_marker(self, seg: str) -> bool:
        found = _NAN_MARKER.match(seg)
        if not found:
            return False  # TRAIN_NAN named mid-line (a refusal, a cleanup), not the guard firing
        detail = found.group(1).strip()
        last = self.series.last.step if self.series.last else None
        return self._event("nan_guard_fired", last,
                           "the NaN guard stopped the run (TRAIN_NAN" + (f": {detail}" if detail else "")
                           + "); no final/ was written; clear final/ TRAIN_DONE TRAIN_NAN before a restart")

    # -------------------------------------------------------------- steps and reports

    def _next_step(self) -> int:
        """The step a record without one belongs to: the one DeepSpeed announced, or the last + 1."""
        last = self.series.last.step if self.series.last else 0
        if self._announced is not None and self._announced > last:
            return self._announced
        return last + 1

    def _eval(self, values: dict[str, float | None]) -> None:
        """An eval dict's loss, at its step or the last training step before it."""
        loss = values.get("eval_loss")
        if loss is None or not math.isfinite(loss):
            return
        step = _as_step(values.get("step"))
        at = (step if step is not None else self.series.last.step if self.series.last else 0, loss)
        self.evals.append(at)
        self._new_evals.append(at)
        del self.evals[:-MAX_EVALS]

    def drain_evals(self) -> list[tuple[int, float]]:
        """The eval losses read since the last call."""
        new, self._new_evals = self._new_evals[-MAX_EVALS:], []
        return new

    def _add_point(self, point: TrainPoint) -> None:
        if self._overlay:
            self._overlay_until(point.step)
            point = self._overlay.get(point.step, point)  # the state's exact point wins for its step
            while self._overlay_at < len(self._overlay_steps) and self._overlay_steps[self._overlay_at] == point.step:
                self._overlay_at += 1
        self._keep(point)

    def _overlay_until(self, step: float) -> None:
        """The overlay's points before step that the stream has not had yet."""
        while self._overlay_at < len(self._overlay_steps) and self._overlay_steps[self._overlay_at] < step:
            self._keep(self._overlay[self._overlay_steps[self._overlay_at]])
            self._overlay_at += 1

    def _keep(self, point: TrainPoint) -> None:
        listed = [self._report(anomaly) for anomaly in self._watch.check(point)]
        self.series.add(point, pinned=any(listed))
        self._new.append(point)

    def _event(self, code: str, step: int | None, message: str) -> bool:
        """A log event worth one report per run (it repeats on every rank and retry)."""
        if code not in self._events_reported:
            self._events_reported.add(code)
            self._report(_anomaly(code, step, message))
        return True

    def _report(self, anomaly: Problem) -> bool:
        """Listed up to MAX_REPORTS a code; then one note, which the result gives the total in.
        Whether it was listed (or noted)."""
        count = self._reports[anomaly.code] = self._reports.get(anomaly.code, 0) + 1
        if count <= MAX_REPORTS:
            self.anomalies.append(anomaly)
        elif count == MAX_REPORTS + 1:
            self._notes[anomaly.code] = len(self.anomalies)
            self.anomalies.append(replace(anomaly, message=f"more than {MAX_REPORTS} {anomaly.code} findings: "
                                                            "the rest are counted, not listed"))
        return count <= MAX_REPORTS + 1


def _named_lines(batch: list[str]) -> list[int]:
    """The indexes, in order, of the lines in batch that name one of NAMES (what _read_line reads)."""
    joined = "\n".join(batch)
    starts = list(itertools.accumulate(map((1).__add__, map(len, batch)), initial=0))  # where each line starts
    found = set()
    for name in NAMES:
        at = joined.find(name)
        while at >= 0:
            line = bisect.bisect_right(starts, at) - 1
            found.add(line)
            at = joined.find(name, starts[line + 1])  # on from the next line: one hit a line is enough
    return sorted(found)


def _dict_values(text: str) -> dict[str, float | None]:
    """The key: number pairs of one printed dict, whichever way the value is written."""
    values = {}
    for key, *forms in _PAIR.findall(text):
        # findall gives "" for the alternatives that did not match; '' is a quoted empty value
        values[key] = _number(next((form for form in forms if form), None))
    return values


# ------------------------------------------------------------------ trainer_state.json


def _state_entries(state: str | Mapping[str, Any]) -> list[Any]:
    """log_history of a trainer_state.json given whole (its text or the loaded object)."""
    if isinstance(state, str):
        stream = HistoryStream()
        entries = list(stream.entries(state.split("\n")))
        stream.close()
        return entries
    history = state.get("log_history") if isinstance(state, Mapping) else None
    if not isinstance(history, list):
        raise ValueError("not a trainer_state.json: it has no log_history list")
    return history


class HistoryStream:
    """The log_history entries of a trainer_state.json, decoded one at a time as its lines come:
    the file is never held whole (json.dumps writes an entry over a few lines). Bare NaN/Infinity
    and nan/inf are read. Nothing raises while lines come; close() says what was wrong."""

    def __init__(self) -> None:
        self._text = ""  # what is not decoded yet: the start of the file, then of the next entry
        self._where = "before"  # before log_history, "in" it, or "after" it
        self._error: str | None = None
        self._decoder = json.JSONDecoder()

    def entries(self, lines: Iterable[str]) -> Iterator[Any]:
        for line in lines:
            if self._where == "after" or self._error is not None:
                continue  # the rest of the file holds no entry (or cannot be trusted to)
            self._text += _BARE_NON_FINITE.sub(_json_non_finite, line) + "\n"
            if self._where == "before" and not self._start():
                continue
            if self._where == "in" and ("}" in line or "]" in line):  # the lines an entry can end on
                yield from self._decode()
            if len(self._text) > MAX_ENTRY:
                self._error = f"a log_history entry runs over {MAX_ENTRY // 1024} KiB"

    def close(self) -> None:
        """The end of the file: a ValueError unless log_history was read whole."""
        if self._error is not None:
            raise ValueError(f"not a readable trainer_state.json: {self._error}")
        if self._where == "before":
            raise ValueError("not a trainer_state.json: it has no log_history list")
        if self._where == "in":
            raise ValueError("not a readable trainer_state.json: it ends inside log_history")

    def _start(self) -> bool:
        found = _HISTORY.search(self._text)
        if found is None:
            self._text = self._text[-64:]  # only where the key may be cut by a line break
            return False
        self._text, self._where = self._text[found.end():], "in"
        return True

    def _decode(self) -> Iterator[Any]:
        text, at = self._text, 0
        while True:
            at = _skip_separators(text, at)
            if at == len(text):
                self._text = ""
                return
            if text[at] == "]":
                self._text, self._where = "", "after"
                return
            try:
                entry, at = self._decoder.raw_decode(text, at)
            except (ValueError, RecursionError) as e:
                pos = getattr(e, "pos", 0)
                if isinstance(e, RecursionError) or pos < len(text.rstrip()):
                    self._error = str(e) if not isinstance(e, RecursionError) else "nested too deep"
                self._text = text[at:]  # an entry not complete yet: more lines will finish it
                return
            yield entry


def _skip_separators(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n,":
        at += 1
    return at


def _json_non_finite(found: re.Match) -> str:
    """`nan`/`inf` written bare, as JSON's NaN/Infinity (outside strings: only after : [ or ,)."""
    word = "NaN" if found.group(3).lower() == "nan" else "Infinity"
    return f"{found.group(1)}{found.group(2)}{word}"


def parse_trainer_state(state: str | Mapping[str, Any]) -> list[TrainPoint]:
    """The training points of a trainer_state.json's log_history (exact steps, full precision)."""
    parser = TrainLogParser()
    return parser.feed_state(_state_entries(state))


# ------------------------------------------------------------------ one-shot check, and the pane's reader


def check_trainlog(lines_or_text: str | Iterable[str],
                   trainer_state: GivenState | None = None) -> TrainLogResult:
    """Points, anomalies and the summary of a whole training log.

    lines_or_text may also be a trainer_state.json (its text or its lines; its log_history
    entries then count as the lines). trainer_state (its text, the loaded object or a Path) adds
    that run's exact points: they replace the log's for the steps they cover, and the point
    anomalies are checked over the merged points."""
    check = TrainLogCheck(trainer_state)
    check.feed(_lines(lines_or_text))
    return check.result()


class TrainLogCheck:
    """A training log read a batch of lines at a time, by `check trainlog` (a log read from the box
    in chunks) and by the training pane alike: feed returns the new points, drain_anomalies the
    new anomalies. Memory holds the points kept (a PointSeries), never the log. The first lines
    tell a trainer_state.json (its log_history entries decoded as they come) from a log."""

    def __init__(self, trainer_state: GivenState | None = None) -> None:
        overlay: list[TrainPoint] = []
        self._state_summary: dict[str, float | None] | None = None
        if trainer_state is not None:
            overlay, self._state_summary = _given_state(trainer_state)
        self.parser = TrainLogParser(overlay)
        self._head: list[str] | None = []  # the first lines, until they tell what kind of file this is
        self._history: HistoryStream | None = None  # a trainer_state.json's reader

    @property
    def anomalies(self) -> list[Problem]:
        return self.parser.anomalies

    @property
    def resumed_from(self) -> int | None:
        """The checkpoint step the run resumed from (its TRAIN_RESUMED line), if it did."""
        return self.parser.resumed_from

    def drain_anomalies(self) -> list[Problem]:
        return self.parser.drain_anomalies()

    def drain_evals(self) -> list[tuple[int, float]]:
        return self.parser.drain_evals()

    def feed(self, lines: Iterable[str]) -> list[TrainPoint]:
        """The new points in lines."""
        lines, new = iter(lines), []
        if self._head is not None:
            for line in lines:
                self._head.append(line)
                kind = _file_kind(self._head)
                if kind is not None:
                    new = self._decide(kind)
                    break
            else:
                return []
        if self._history is not None:
            return new + self.parser.feed_state(self._history.entries(lines))
        return new + self.parser.feed(lines)

    def result(self) -> TrainLogResult:
        """The check's result, once every line was fed (call it once): a ValueError for a
        trainer_state.json that cannot be read."""
        if self._head is not None:
            self._decide(_file_kind(self._head, at_end=True) or "log")
        if self._history is not None:
            self._history.close()
        self.parser.finish()
        result = self.parser.result()
        if result.summary is None and self._state_summary is not None:
            result = replace(result, summary=self._state_summary)
        if not result.steps and result.summary is None and not result.problems:
            result = replace(result, problems=(_nothing_found(result.lines, result.unparsed),))
        return result

    def _decide(self, kind: str) -> list[TrainPoint]:
        head, self._head = self._head or [], None
        if kind == "state":
            self._history = HistoryStream()
            return self.parser.feed_state(self._history.entries(head))
        return self.parser.feed(head)


def newest_run_points(check: TrainLogCheck, lines: list[str],
                      first_line: int | None = None) -> tuple[TrainLogCheck, bool, list[TrainPoint]]:
    """A followed training log's next lines: the check that reads on (a new one where a run
    starts: a run header as the first line of a file, first_line its index in lines, as the
    follower says it), whether it is a new one, and the new points of the newest run. A header
    anywhere else is the stage's text: it starts nothing, so the run's anomalies stay its own."""
    newest = new_run(lines, first_line)
    if newest is None:
        return check, False, check.feed(lines)
    check = TrainLogCheck()
    return check, True, check.feed(newest)


def _file_kind(head: list[str], at_end: bool = False) -> str | None:
    """"state" for a trainer_state.json, "log" for a log, None while the lines so far (the newest
    last) cannot tell: a JSON object's opening line waits for "log_history", up to STATE_PEEK
    lines and STATE_PEEK_CHARS characters (what is held until then)."""
    first = next((line for line in head if line and not line.isspace()), None)
    if first is None:
        return "log" if at_end or len(head) >= STATE_PEEK else None
    indent = len(first) - len(first.lstrip())
    if first[indent:indent + 1] != "{" or first[indent:indent + 2] == "{'":  # {' opens a Trainer dict
        return "log"
    if '"log_history"' in head[-1]:
        return "state"
    return "log" if at_end or len(head) >= STATE_PEEK or sum(map(len, head)) > STATE_PEEK_CHARS else None


def _nothing_found(lines: int, unparsed: int) -> Problem:
    """Not "no problems": a check that read nothing it knows has judged nothing."""
    if not lines:
        return _anomaly("no_training_data", None, "the file is empty: no training step to check")
    return _anomaly("no_training_data", None,
                    f"nothing parseable in {lines} lines ({unparsed} of them text this reader does not know): "
                    "no training step, summary or known event; is it the training log?")


def check_trainlog_path(path: str | os.PathLike, trainer_state: GivenState | None = None) -> TrainLogResult:
    """check_trainlog over a local file, streamed as the box's is read: in chunks, lines split on
    \\n only (\\r stays in the line), a line of megabytes in pieces (see longlines)."""
    check, decoder = TrainLogCheck(trainer_state), PieceDecoder()
    with open(path, "rb") as f:
        while chunk := f.read(READ):
            check.feed(decoder.feed(chunk))
    last = decoder.flush()
    check.feed([] if last is None else [last])
    return check.result()


def _lines(lines_or_text: str | Iterable[str]) -> Iterator[str]:
    if not isinstance(lines_or_text, str):
        return iter(lines_or_text)
    lines = lines_or_text.split("\n")  # not splitlines(): that would also split on tqdm's \r
    if lines and lines[-1] == "":
        lines.pop()
    return iter(lines)


def _given_state(state: GivenState) -> tuple[list[TrainPoint], dict[str, float | None] | None]:
    """A trainer_state.json given beside the log: its points and its summary."""
    if isinstance(state, os.PathLike):
        with open(state, encoding="utf-8", errors="replace") as f:
            state = f.read()
    parser = TrainLogParser()
    return parser.feed_state(_state_entries(state)), parser.summary
