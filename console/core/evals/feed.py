"""The evals feed: the eval and computer-use runs whose summaries the poll brings back (the eval
pane), and the newest finished run's items read whole once, beside the poll, and checked
(`check eval`: the fake 0 %, empty or truncated answers), judged by the `eval` detector."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samai.console.core.alertbook import Alert
from samai.console.core.evals.runs import EvalRun, RunCheck, check_items, newest_run, read_eval_runs
from samai.console.core.feeds import Feed, Poll, Read, Surroundings
from samai.console.core.problems import Finding


@dataclass(frozen=True)
class EvalRuns:
    runs: list[EvalRun]


class EvalsFeed(Feed):
    name = "evals"
    detectors = ("eval",)

    def __init__(self, state, around: Surroundings) -> None:
        super().__init__(state, around)
        self.reports: tuple[list[EvalRun], list[Finding]] = ([], [])
        # The newest eval run and its items' check (that None: not read yet, or unreadable); None: no run.
        self.checked: tuple[EvalRun, RunCheck | None] | None = None

    def fold(self, poll: Poll) -> list[Alert]:
        self.reports = read_eval_runs(poll.snapshot.reports)
        return []

    def reads(self, now: float) -> list[Read]:
        newest = newest_run(self.reports[0])
        checked = self.checked[0] if self.checked else None
        if newest is None or (checked and (checked.folder, checked.mtime) == (newest.folder, newest.mtime)):
            return []
        self.checked = (newest, None)  # taken as checked: its items are read once
        return [Read(f"eval run {newest.name}'s items", lambda box: check_items(box, newest),
                     lambda result, now: self._checked(newest, result))]

    def _checked(self, run: EvalRun, result: RunCheck | None) -> list[Alert]:
        if self.checked and self.checked[0] == run and result is not None:  # not a newer run's meanwhile
            self.checked = (run, result)
        return []

    def context(self) -> dict[str, Any]:
        return {"eval_checked": self.checked, "eval_reports": self.reports}

    def view(self) -> EvalRuns:
        return EvalRuns(self.reports[0])
