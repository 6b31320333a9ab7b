"""The box screen: each box or target gets a screen of its own, so switching leaves nothing of
the old one on show and none of its workers running."""

from __future__ import annotations

from textual.widgets import Input

from samai.console.core.training.trainlog import TrainPoint
from samai.console.screens.box import BoxScreen
from samai.console.screens.dialogs import PathDialog
from samai.widgets.curves import CurvesPane
from samai.widgets.disk import DiskPane
from samai.widgets.logview import LogView
from tests.helpers import pilot_until
from tests.test_log_navigation import SIZE, _app

UNREACHABLE = "ssh://nobody@127.0.0.1:1"  # refused at once: the new screen is up, its box is not


async def test_switching_target_leaves_nothing_of_the_old_target_on_show(tmp_path, workspace):
    (workspace / "any.log").write_text("a line of the old target\n")
    app = _app(tmp_path, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        old = app.box_screen
        await pilot.press("o")  # a file of the old target: the log history holds it
        await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog))
        await pilot.press(*"any.log", "enter")
        await pilot_until(pilot, lambda: "a line of the old target" in old.query_one(LogView).lines)
        await pilot.press("u")  # the largest users: a walk of the workspace, in flight or done
        old.query_one(CurvesPane).add([TrainPoint(step=s, loss=1.0 / s, grad_norm=1.0) for s in range(1, 4)])
        assert old.query_one(DiskPane).largest and old.logs.history.recent_files

        app.switch_target()
        dialog = await pilot_until(pilot, lambda: isinstance(app.screen, PathDialog) and app.screen)
        dialog.query_one(Input).value = UNREACHABLE
        await pilot.press("enter")
        new = await pilot_until(pilot, lambda: app.screen is not old and isinstance(app.screen, BoxScreen)
                                and app.screen)

        assert new is app.box_screen and not old.is_attached
        # Its walk and poll end with it: cancelled at once, finished as soon as their tasks see it.
        try:
            await pilot_until(pilot, lambda: not [w for w in app.workers if w.node is old and not w.is_finished])
        except AssertionError:
            running = [(w.name, w.state) for w in app.workers if w.node is old]
            raise AssertionError(f"still running: {running}") from None
        assert app.config.target.url == UNREACHABLE and UNREACHABLE in app.connection.target
        assert new.shown_stage == "hello" and str(new.query_one(LogView).border_title) == "log · hello"
        assert "a line of the old target" not in new.query_one(LogView).lines
        assert new.logs.history.recent_files == () and new.logs.history.current is not None  # the history starts again
        assert new.query_one(CurvesPane).points == [] and not new.query_one(DiskPane).largest
        await pilot_until(pilot, lambda: app.connection.state != "connected" and app.connection.error)


async def test_every_pane_of_the_box_screen_takes_the_poll_through_one_protocol(tmp_path, workspace):
    from samai.widgets.pane import ShowsUpdates

    app = _app(tmp_path, workspace, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.screen is app.box_screen)
        taking = {w.id for w in app.box_screen.query("*") if isinstance(w, ShowsUpdates)}
        assert taking == {"stages", "disk", "gpus", "serving", "processes", "log", "curves", "evals", "alerts"}


async def test_lines_of_the_log_shown_when_a_poll_began_never_reach_the_log_it_switched_to(tmp_path, workspace):
    """One poll brings the first stage's log lines and finds another stage running: the pane
    follows the running stage, and the first log's lines are not appended under its title."""
    from tests.helpers import run_cli
    from tests.test_run_state import _config

    (workspace / "logs").mkdir()
    (workspace / "logs" / "provision.log").write_text("".join(f"provision line {i}\n" for i in range(20)))
    cfg = _config(tmp_path, workspace, '[stages.provision]\nkey = "p"\ncommand = "echo provisioning"\n'
                                       '[stages.serve]\nkey = "v"\ncommand = "echo serve line one; sleep 30"\n')
    assert run_cli("--config", str(tmp_path / "run-state.toml"), "fire", "serve", "--yes").returncode == 0
    app = type(_app(tmp_path, workspace))(cfg, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot_until(pilot, lambda: app.screen is app.box_screen and app.box_screen.shown_stage)
        screen = app.box_screen
        assert screen.shown_stage == "provision"
        followers = screen.state.followers()
        snap = await screen.session.connected_box().snapshot(**screen.state.request(followers))
        screen.show_snapshot(snap, followers)  # provision's lines, and serve running: the pane follows serve
        log = screen.query_one(LogView)
        assert screen.shown_stage == "serve" and "log · serve" in str(log.border_title)
        assert not any("provision line" in line for line in log.lines)
