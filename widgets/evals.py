"""Eval results: one row per eval run, with the counts that expose a fake 0 %."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import DataTable

from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.pane import set_subtitle

if TYPE_CHECKING:
    from samai.console.core.evals.runs import EvalRun
    from samai.console.core.update import StateUpdate


class EvalTable(DataTable):
    DEFAULT_CSS = "EvalTable { height: 1fr; }"
    BINDINGS = bindings("evals")

    _runs: list[EvalRun] | None = None  # the runs on show, newest first

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("run", "n", "accuracy", "empty", "truncated")

    def show_update(self, update: StateUpdate) -> None:
        from samai.console.core.evals.feed import EvalRuns

        runs = update.view(EvalRuns)
        if runs is not None:
            self.show(runs.runs)

    def show(self, runs: list[EvalRun]) -> None:
        newest_first = sorted(runs, key=lambda r: r.mtime, reverse=True)
        if newest_first == self._runs:
            return  # rebuilding the same rows would repaint the table (and its scroll bars) for nothing
        self._runs = newest_first
        self.clear()
        for r in self._runs:
            # A run's name is a folder on the box: DataTable would parse a str as markup.
            name = Text(visible(r.name), no_wrap=True, end="")
            self.add_row(name, str(r.n), *_figures(r), key=r.folder or r.name)  # names may repeat
        set_subtitle(self, f"{len(runs)} runs" if runs else "no eval runs yet")

    def selected_and_previous(self) -> tuple[EvalRun, EvalRun] | None:
        """The run under the cursor and the one before it (the next older), for a diff."""
        runs = self._runs or []
        row = self.cursor_row
        return (runs[row], runs[row + 1]) if 0 <= row < len(runs) - 1 else None


def _figures(r: EvalRun) -> tuple[str, str, str]:
    """The accuracy and the two counts that expose a fake score: an eval run's empty answers and
    truncations, a computer-use run's answers that were no action (and the actions that missed: no
    element on the page of that name) and its episodes that did not run."""
    acc = "?" if r.accuracy is None else f"{100 * r.accuracy:.1f} %"
    if r.kind == "cu":  # its answers that were no action of their task: no action at all, or actions that missed
        no_action, missed = r.parse_failures - min(r.missed, r.parse_failures), min(r.missed, r.parse_failures)
        mostly_no_action = r.n and no_action > r.n // 2
        return acc + (" cu (no actions?)" if mostly_no_action else " cu"), \
            f"{no_action} no action" + (f", {missed} missed" if missed else ""), \
            f"{r.errors} error{'s' if r.errors != 1 else ''}"
    suspicious = r.n and (r.empty_content > r.n // 2)
    return acc + (" (fake 0?)" if suspicious and not r.accuracy else ""), str(r.empty_content), str(r.truncated)
