"""The serve pane: a running server's figures from its (recorded, real) answers, a hostile model
name and notes shown literally, hidden while nothing serves."""

from __future__ import annotations

import json

from textual.app import App, ComposeResult

from samai.console.core.serving_watch import ServingWatch
from samai.remote.model import EndpointAnswer, PortAnswers
from samai.widgets.serving import ServePane, serving_block, sparkline
from tests.test_serving_watch import PORT, answers, cfg, snap

HOSTILE = "[b]x [@click=app.quit]q [$v] \x1b]0;pwned\x07"  # a file name: no "/"


def _views(*states: str) -> ServingWatch:
    watch = ServingWatch(cfg())
    for i, state in enumerate(states):
        watch.findings(snap(100.0 + 3 * i, answers(state)))
    return watch


def test_a_busy_server_s_block_says_its_figures() -> None:
    text = serving_block(_views("idle", "busy").views[PORT]).plain
    assert f"serve :{PORT} ok" in text and "model.gguf · ctx 256 × 2" in text
    assert "running 2 · deferred 1" in text and "slot 0 " in text and "/256" in text and "tok/s" in text


def test_a_stall_and_a_missing_metrics_endpoint_are_said() -> None:
    watch = ServingWatch(cfg())
    for at in (100.0, 105.0, 111.0):
        watch.findings(snap(at, answers("busy", skip=("/metrics",))))
    text = serving_block(watch.views[PORT]).plain
    assert "no progress for 11 s with requests in flight" in text
    assert "no /metrics (HTTP 404) (started without --metrics? an older build?)" in text


def test_box_text_in_the_block_is_literal() -> None:
    props = json.dumps({"model_path": f"/m/{HOSTILE}", "total_slots": 1})
    busy = answers("busy")
    port = PortAnswers(PORT, tuple(EndpointAnswer("/props", 200, props, 0.01) if a.path == "/props" else
                                   EndpointAnswer("/slots", 500, "", 0.01) if a.path == "/slots" else a
                                   for a in busy.answers))
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, port))
    block = serving_block(watch.views[PORT])
    assert "\x1b" not in block.plain and "\x07" not in block.plain
    assert "[b]x [@click=app.quit]q [$v] ␛]0;pwned␇" in block.plain


def test_the_sparkline_scales_to_its_own_top() -> None:
    assert sparkline((0.0, 5.0, 10.0, None, 10.0)) == "▁▅█ █"
    assert sparkline((None, 0.0)) == " ▁" and sparkline(tuple(float(i) for i in range(100)), 8)[-1] == "█"


class _One(App):
    def compose(self) -> ComposeResult:
        yield ServePane(id="serving")


async def test_the_pane_is_hidden_until_a_server_runs() -> None:
    app = _One()
    async with app.run_test() as pilot:
        pane = app.query_one(ServePane)
        pane.show(())
        await pilot.pause()
        assert not pane.display
        pane.show(tuple(_views("idle", "busy").views.values()))
        await pilot.pause()
        assert pane.display and str(pane.border_subtitle) == "llama.cpp"
