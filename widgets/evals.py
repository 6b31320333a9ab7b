"""Eval results: two lines per eval run, its figures first, with the counts that expose a fake 0 %."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.pane import set_subtitle

if TYPE_CHECKING:
    from samai.console.core.evals.runs import EvalRun
    from samai.console.core.update import StateUpdate


class EvalTable(DataTable):
    DEFAULT_CSS = "EvalTable { height: 1fr; scrollbar-size-vertical: 1; }"  # a column more for the counts
    BINDINGS = bindings("evals")

    _runs: list[EvalRun] | None = None  # the runs on show, newest first

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self._rebuild([])

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
        self._rebuild(newest_first)
        set_subtitle(self, f"{len(runs)} runs" if runs else "no eval runs yet")

    def _rebuild(self, runs: list[EvalRun]) -> None:
        # Two lines a run, its figures first: its kind, score and name, and under them what the score
        # is of and its counts. The name (a folder on the box, any length) ends its line, so a long
        # one is what the pane's edge cuts, never a figure.
        rows = []
        for r in runs:
            kind, score, counts = _figures(r)
            # A run's name is a folder on the box: DataTable would parse a str as markup.
            run = Text("\n").join([Text(visible(r.name)), Text(counts)])
            rows.append(((Text(kind), Text(f"{score}\nof {r.n}"), run), r.folder or r.name))  # names may repeat
        # Each column as wide as its widest cell, said rather than measured: the table measures new
        # rows when idle, and a row painted before then keeps the cells cut to the old widths (its
        # cell cache is not keyed by width: textual issue 3533).
        self.clear(columns=True)
        for i, label in enumerate(("kind", "score", "run")):
            self.add_column(label, width=max([len(label)] + [_width(cells[i]) for cells, _ in rows]), key=label)
        for cells, key in rows:
            self.add_row(*cells, height=2, key=key)

    def selected_and_previous(self) -> tuple[EvalRun, EvalRun] | None:
        """The run under the cursor and the one before it (the next older), for a diff."""
        runs = self._runs or []
        row = self.cursor_row
        return (runs[row], runs[row + 1]) if 0 <= row < len(runs) - 1 else None


def _width(cell: Text) -> int:
    return max(cell_len(line) for line in cell.plain.split("\n"))


def _figures(r: EvalRun) -> tuple[str, str, str]:
    """Its kind, its score and the counts that expose a fake score: an eval run's empty answers and
    truncations; a computer-use run's answers that were no action at all, its actions that missed
    (no element on the page of that name) and its episodes that did not run (errors)."""
    score = "?" if r.accuracy is None else f"{100 * r.accuracy:.1f} %"
    if r.kind == "cu":
        missed = min(r.missed, r.parse_failures)
        no_action = r.parse_failures - missed
        counts = f"{no_action} no action, {missed} missed, {r.errors} error{'' if r.errors == 1 else 's'}"
        return "cu", score, counts + (" (no actions?)" if r.n and no_action > r.n // 2 else "")
    fake = r.n and r.empty_content > r.n // 2 and not r.accuracy
    return "eval", score, f"{r.empty_content} empty, {r.truncated} truncated" + (" (fake 0?)" if fake else "")
