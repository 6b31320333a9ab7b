"""The computer-use runner against real pages in the real headless Chromium (Playwright): DOM
assertions that pass and fail, answers that are no action, a page that hangs, one that navigates
away, one that crashes its renderer, one that reaches outside loopback; the browser always closed.

The model here is a loopback server that answers what each test tells it to: what is under test
is the browser side. The real model is asked in the vlm pipeline's end-to-end test."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from samai.remote.box.stages import cu_eval
from samai.remote.box.stages.chromium import BrowserMissing, find_browser
from samai.remote.box.stages.webtasks import TaskError, read_tasks

try:
    BROWSER: str | None = find_browser()
except BrowserMissing:
    BROWSER = None
# CI installs chromium-headless-shell and sets SAMAI_REQUIRE_BROWSER=1: there a missing browser fails.
pytestmark = pytest.mark.skipif(BROWSER is None and not os.environ.get("SAMAI_REQUIRE_BROWSER"),
                                reason="no headless Chromium here (apt-get install chromium-headless-shell)")

BUTTONS = """<!doctype html><html><body style="margin:0">
<div id="shape" style="width:100px;height:100px;background:rgb(220,30,30)"></div>
<p id="result"></p>
<button data-name="red">red</button><button data-name="blue">blue</button>
<input id="name"><select id="size"><option>small</option><option>large</option></select>
<script>
for (const b of document.querySelectorAll("button"))
  b.onclick = () => { result.textContent = b.dataset.name; location.hash = "pressed-" + b.dataset.name; };
</script></body></html>"""
ELEMENTS = {"red": {"selector": "button[data-name=red]"}, "blue": {"selector": "button[data-name=blue]"},
            "name": {"selector": "#name", "action": "type"}, "size": {"selector": "#size", "action": "select"}}
PRESSED_RED = [{"check": "text", "selector": "#result", "equals": "red"}, {"check": "url", "contains": "#pressed-red"}]


class Model:
    """A chat server on loopback that answers each request with the next of `answers`."""

    def __init__(self) -> None:
        self.answers: list[str] = []
        self.asked: list[dict] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the base class's name)
                model.asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                answer = model.answers.pop(0) if model.answers else ""
                body = json.dumps({"choices": [{"message": {"content": answer}, "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def model() -> Iterator[Model]:
    m = Model()
    threading.Thread(target=m.httpd.serve_forever, daemon=True).start()
    yield m
    m.httpd.shutdown()
    m.httpd.server_close()


def tasks_file(folder: Path, pages: dict[str, str], tasks: list[dict]) -> Path:
    (folder / "pages").mkdir(parents=True, exist_ok=True)
    for name, html in pages.items():
        (folder / "pages" / name).write_text(html)
    path = folder / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def task(task_id: str, page: str = "buttons.html", checks: list | None = None, **extra) -> dict:
    return {"id": task_id, "page": "pages/" + page, "instruction": "press the colour of the shape",
            "elements": ELEMENTS, "assert": checks or PRESSED_RED, **extra}


def run(path: Path, out: Path, model: Model, answers: list[str], **kw) -> list[dict]:
    model.answers = list(answers)
    options = dict(samples=1, browser_path=BROWSER, viewport=(224, 224), episode_s=3.0, run_s=120.0)
    options.update(kw)
    rows, version = cu_eval.run(read_tasks(str(path)), str(path.parent), str(out), cu_eval.Asking(model.url),
                                **options)
    assert version
    return rows


def test_assertions_that_pass_and_fail_and_answers_that_are_no_action(tmp_path: Path, model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [
        task("right"), task("wrong"), task("none"), task("typed", checks=[
            {"check": "value", "selector": "#name", "equals": "ada lovelace"}]),
        task("chosen", checks=[{"check": "value", "selector": "#size", "equals": "large"}]),
        task("thinking")])
    rows = run(path, tmp_path / "out", model, ["red", "click blue", "a banana", "type name ada lovelace",
                                                "select size large", "<think>blue?</think>press red"])
    by = {r["task"]: r for r in rows}
    assert by["right"]["reward"] == 1 and [a["passed"] for a in by["right"]["assertions"]] == [True, True]
    assert by["right"]["action"] == {"do": "click", "element": "red", "selector": "button[data-name=red]"}
    assert by["right"]["url"].endswith("#pressed-red")
    assert by["wrong"]["reward"] == 0 and by["wrong"]["action"]["element"] == "blue"
    assert [a["passed"] for a in by["wrong"]["assertions"]] == [False, False]
    assert by["wrong"]["assertions"][0]["actual"] == "blue"
    none = by["none"]
    assert none["action"] is None and none["error"] is None and "no action" in none["parse_error"]
    assert none["reward"] == 0 and none["answer"] == "a banana"
    assert by["typed"]["reward"] == 1 and by["chosen"]["reward"] == 1 and by["thinking"]["reward"] == 1
    for r in rows:
        assert r["sent"] == r["original"] == [224, 224] and (tmp_path / "out" / r["shot"]).is_file()
    sent = model.asked[0]["messages"][0]["content"]
    assert sent[0]["image_url"]["url"].startswith("data:image/png;base64,") and sent[1]["text"].startswith("press")
    assert cu_eval.summarize(rows)["parse_failures"] == 1


def test_a_page_that_hangs_is_its_episodes_error_and_the_next_one_runs(tmp_path: Path, model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS, "hang.html": "<script>while (true) {}</script>"},
                      [task("hangs", "hang.html"), task("after")])
    started = time.monotonic()
    rows = run(path, tmp_path / "out", model, ["red"], episode_s=2.0)
    assert time.monotonic() - started < 30
    assert "Timeout" in rows[0]["error"] and rows[0]["reward"] == 0 and rows[0]["answer"] is None
    assert rows[1]["reward"] == 1 and rows[1]["error"] is None


def test_a_page_that_crashes_its_renderer(tmp_path: Path, model: Model) -> None:
    greedy = "<script>let a = []; while (true) a.push(new Array(1e6).fill(1.5));</script>"
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS, "greedy.html": greedy},
                      [task("crashes", "greedy.html"), task("after")])
    rows = run(path, tmp_path / "out", model, ["red"], episode_s=10.0)
    assert "crashed" in rows[0]["error"] and rows[0]["reward"] == 0
    assert rows[1]["reward"] == 1


def test_a_page_that_navigates_away(tmp_path: Path, model: Model) -> None:
    away = BUTTONS.replace("location.hash = \"pressed-\" + b.dataset.name;", "location.href = 'other.html';")
    outside = "<script>location.href = 'http://example.invalid/';</script>"
    path = tasks_file(tmp_path / "t", {"away.html": away, "other.html": "<p id=result>elsewhere</p>",
                                       "outside.html": outside},
                      [task("away", "away.html", checks=[{"check": "url", "contains": "other.html"},
                                                         {"check": "text", "selector": "#result", "equals": "red"}]),
                       task("outside", "outside.html")])
    rows = run(path, tmp_path / "out", model, ["red", "red"])
    assert [a["passed"] for a in rows[0]["assertions"]] == [True, False]  # it went; the text it set went with it
    assert rows[0]["assertions"][1]["actual"] == "elsewhere" and rows[0]["reward"] == 0
    assert "example.invalid" not in (rows[1]["url"] or "") or rows[1]["reward"] == 0
    assert rows[1]["reward"] == 0


def test_nothing_outside_loopback_is_fetched(tmp_path: Path, model: Model) -> None:
    # A page's request to any other origin is refused by the runner, not sent.
    probe = ("<img id=pic src='http://192.0.2.1/x.png' onerror=\"result.textContent='blocked'\"><p id=result></p>"
             "<button data-name=red>red</button>")
    path = tasks_file(tmp_path / "t", {"p.html": probe}, [task("p", "p.html", checks=[
        {"check": "text", "selector": "#result", "equals": "blocked"}])])
    started = time.monotonic()
    (row,) = run(path, tmp_path / "out", model, ["red"])
    assert row["assertions"][0]["passed"] and time.monotonic() - started < 20


def test_pages_outside_the_task_folder_are_neither_run_nor_served(tmp_path: Path, model: Model) -> None:
    (tmp_path / "secret.html").write_text("<p id=result>red</p>")
    folder = tmp_path / "t"
    path = tasks_file(folder, {"buttons.html": BUTTONS},
                      [task("out", "../../secret.html"), task("linked", "link.html")])
    (folder / "pages" / "link.html").symlink_to(tmp_path / "secret.html")
    rows = run(path, tmp_path / "out", model, ["red", "red"])
    assert rows[0]["task"] is None and "leaves" in rows[0]["error"]  # refused as written
    # A symlink out is refused by read_tasks too (the page is resolved inside the folder).
    assert rows[1]["error"] and rows[1]["reward"] == 0
    assert any(isinstance(t, TaskError) for t in read_tasks(str(path)))


def test_a_screenshot_over_the_cap_is_sent_capped(tmp_path: Path, model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("big")])
    (row,) = run(path, tmp_path / "out", model, ["red"], viewport=(1600, 1000))
    assert row["original"] == [1600, 1000] and row["sent"] == [1120, 700] and row["reward"] == 1


def test_the_run_limit_and_an_unreachable_model(tmp_path: Path, model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("a"), task("b")])
    rows = run(path, tmp_path / "out", model, [], run_s=0.0)
    assert all("limit" in r["error"] for r in rows)
    model.httpd.shutdown()
    model.httpd.server_close()
    rows = run(path, tmp_path / "out2", model, [])
    assert all("cannot reach the model" in r["error"] for r in rows) and len(rows) == 2


def test_the_browser_is_closed_after_the_run(tmp_path: Path, model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("a")])
    run(path, tmp_path / "out", model, ["red"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
        if not left:
            break
        time.sleep(0.2)
    assert not left, left


def test_a_model_slower_than_the_episode_limit_is_that_episodes_error(tmp_path: Path) -> None:
    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the base class's name)
            time.sleep(5)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("slow")])
        started = time.monotonic()
        (row,) = cu_eval.run(read_tasks(str(path)), str(path.parent), str(tmp_path / "out"),
                             cu_eval.Asking(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=60),
                             samples=1, browser_path=BROWSER, viewport=(224, 224), episode_s=2.0, run_s=60)[0]
        assert time.monotonic() - started < 4.5 and row["seconds"] < 3
        assert row["error"].startswith("the model's server") and row["reward"] == 0 and row["shot"]
    finally:
        httpd.shutdown()
        httpd.server_close()
