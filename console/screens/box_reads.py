"""What the box screen reads from the box only because the operator asked for it: a stage's runs
(`H`, and one picked there as the training run's reference), the timeline (`T`), two eval runs
compared (`d`). Everything else it shows, the session reads (console/core/feeds/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from samai.console.core.roles import Role
from samai.remote.errors import BoxError
from samai.remote.safe_text import visible
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.console.screens.box_base import BoxScreenBase


class OperatorReads:
    def __init__(self, screen: BoxScreenBase) -> None:
        self.screen = screen

    def _notify(self, text: str, severity: str = "information") -> None:
        self.screen.notify(text, severity=severity, markup=False)  # type: ignore[arg-type]  # box text: never markup

    async def runs(self) -> None:
        """The shown stage's runs, read back from its logs (the history outlives the console)."""
        from samai.console.core.training.history import read_history
        from samai.console.screens.dialogs import RunsScreen  # each dialog's module is imported when one opens

        screen = self.screen
        stage = screen.config.stage(screen.shown_stage or "")
        if stage is None or screen.box is None:
            self._notify("show a stage's log first (l), then H lists its runs")
            return
        runs, problems = await read_history(screen.box, screen.config.path_of(stage.log), stage.markers)
        chosen = await screen.app.push_screen_wait(RunsScreen(stage.name, runs, "; ".join(problems)))
        if chosen is not None and stage.name == screen.config.role_name(Role.TRAIN) and chosen.path:
            await self._reference_from(chosen.path)

    async def _reference_from(self, path: str) -> None:
        """A run picked in H as the followed training run's reference, in place of the last good
        one: handed to the training feed, which compares the run with it at once."""
        from samai.console.core.checks import Unreadable, check_trainlog
        from samai.console.core.training.feed import TrainingFeed
        from samai.console.core.training.trainref import Reference

        screen = self.screen
        try:
            points = (await check_trainlog(screen.session.connected_box(), path)).points
        except (Unreadable, BoxError, TransportError, ValueError) as e:
            self._notify(f"that run's curve was not read: {visible(str(e))}", "warning")
            return
        label, training = path.rsplit("/", 1)[-1], screen.state.feed(TrainingFeed)
        if training is not None:
            reference = Reference(label, points)
            screen.show_beside_poll(screen.state.fold_beside(
                training, lambda: training.set_reference(reference, picked=True), screen.clock()))
        self._notify(f"comparing with {visible(label)}")

    async def timeline(self) -> None:
        """Everything that happened on the box, in order (`timeline`), with this console's alerts;
        Enter on a row opens its log in the log pane, at the row's own line."""
        from samai.console.core import paths
        from samai.console.core.timeline import alert_events, line_start, read_timeline
        from samai.console.screens.dialogs import TimelineScreen
        from samai.widgets.logview import LogView

        screen, box = self.screen, self.screen.box
        if box is None:
            self._notify("not connected to the box yet")
            return
        try:
            events = await read_timeline(box, screen.config, paths.audit_log(),
                                         more=alert_events(screen.state.alerts))
        except (BoxError, TransportError) as e:
            self._notify(f"timeline: {visible(str(e))}", "warning")
            return
        chosen = await screen.app.push_screen_wait(TimelineScreen(events))
        if chosen is None or not chosen.path:
            return
        offset, index = None, None
        if chosen.line:
            try:
                offset, index = await line_start(box, chosen.path, chosen.line)
            except (BoxError, TransportError) as e:  # its end, then, as `o` opens a file
                screen.log.warning("the row's line not found", e)
        screen.logs.show_file(chosen.path, offset=offset)
        if index is not None:
            screen.query_one(LogView).go_to_line(index)  # the row's own line, once it is read

    async def eval_diff(self) -> None:
        """The eval run under the cursor against the one before it, read from the box (`eval diff`)."""
        from samai.console.core.evals.diff import diff
        from samai.console.core.evals.runs import read_run_items
        from samai.console.report import describe_diff
        from samai.console.screens.dialogs import EvalDiffScreen
        from samai.widgets.evals import EvalTable

        screen, box = self.screen, self.screen.box
        pair = screen.query_one(EvalTable).selected_and_previous()
        if pair is None or box is None:
            self._notify("put the cursor on an eval run that has one before it, then d")
            return
        if any(run.kind == "cu" for run in pair):
            self._notify("d compares eval runs' answers; a computer-use run's episodes are checked with "
                         "`check eval runs/cu/NAME/episodes.jsonl`")
            return
        runs = []
        for run in reversed(pair):  # A: the older one
            try:
                items = await read_run_items(box, run.name, run.items)
            except (BoxError, TransportError) as e:
                items, missing = None, str(e)
            else:
                missing = f"no {run.items} on the box"
            if items is None:
                self._notify(f"eval diff: run {visible(run.name)}: {visible(missing)}", "warning")
                return
            runs.append(items)
        screen.app.push_screen(EvalDiffScreen(describe_diff(diff(*runs))))
