"""The serve pane: a running server's figures from its (recorded, real) answers, a hostile model
name and notes shown literally, hidden while nothing serves."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from textual.app import App, ComposeResult

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.serving.watch import ServingWatch
from samai.remote.boxapi import Box
from samai.remote.model import EndpointAnswer, PortAnswers
from samai.widgets.serving import ServePane, serving_block, sparkline
from tests.helpers import pilot_until
from tests.replay_transport import ReplayTransport
from tests.test_serving_watch import PORT, RECORDED, answers, cfg, snap

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


class _Recorded(BaseHTTPRequestHandler):
    """A llama-server as it answered when busy (tests/data/serving), over a real socket."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        name = {"/health": "health.json", "/metrics": "metrics.txt", "/slots": "slots.json",
                "/props": "props.json"}.get(self.path)
        if name is None:
            self.send_error(404)
            return
        body = (RECORDED / f"busy.{name}").read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_the_box_screen_shows_a_running_server_as_the_box_reads_it(recorded_box: ReplayTransport) -> None:
    """The whole path: the console's poll asks the serve stage's port, the box's own reader asks a
    real socket, and the box screen's serve pane shows the figures."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    recorded_box.probe["states"].append({**recorded_box.probe["states"][-1], "stage": "serve", "pid": 5100,
                                         "pgid": 5100, "sid": 5100, "group": [5100], "start_time": 1795992800.0})
    tiny = config.load_builtin("tiny")
    cfg = replace(tiny, workspace=recorded_box.workspace, target=replace(tiny.target, poll_interval=0.05),
                  stages=tuple(replace(s, ports=(port,)) if s.name == "serve" else s for s in tiny.stages))
    recorded_box.clock = time.time
    app = SamaiApp(cfg, open_box=lambda _cfg: Box(recorded_box, recorded_box.workspace))
    try:
        async with app.run_test(size=(150, 48)) as pilot:
            pane = app.box_screen.query_one(ServePane)
            await pilot_until(pilot, lambda: pane.display and "running 2 · deferred 1" in str(pane.render()))
            shown = str(pane.render())
            assert f"serve :{port} ok" in shown and "model.gguf · ctx 256 × 2" in shown, shown
            assert str(pane.border_subtitle) == "llama.cpp"
    finally:
        server.shutdown()
        server.server_close()
