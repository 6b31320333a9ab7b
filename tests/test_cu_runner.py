"""The computer-use runner against real pages in the real headless Chromium (Playwright): DOM
assertions that pass and fail, answers that are no action, a page that hangs, one that navigates
away, one that crashes its renderer, one that reaches outside loopback (requests, and what request
routing does not see: WebSockets, workers, WebRTC, service workers); assertions that hold on any
page refused; every wait of an episode within its one limit; the browser always closed.

The model here is a loopback server that answers what each test tells it to: what is under test
is the browser side. The real model is asked in the vlm pipeline's end-to-end test."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from samai.remote.box.stages import cu_eval
from samai.remote.box.stages.browser import CHECK_S, Browser, PageServer
from samai.remote.box.stages.chromium import BrowserMissing, find_browser
from samai.remote.box.stages.webtasks import MAX_CHECKS, TaskError, read_tasks

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
    # An episode's limit holds for its every step: generous, for a busy machine.
    options = dict(samples=1, browser_path=BROWSER, viewport=(224, 224), episode_s=10.0, run_s=300.0)
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
    rows = run(path, tmp_path / "out", model, ["red"], episode_s=2.0)
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
    (row,) = run(path, tmp_path / "out", model, ["red"])
    assert row["assertions"][0]["passed"]  # refused at once: the image's error came within the episode


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
    deadline = time.monotonic() + 60  # a wait for the condition, generous on a busy machine
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
        if not left:
            break
        time.sleep(0.2)
    assert not left, left


def test_a_model_slower_than_the_episode_limit_is_that_episodes_error(tmp_path: Path) -> None:
    # The server holds the request until the test ends: only a client timeout ends it, and the
    # request's own (600 s) would end in the server closing without an answer.
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the base class's name)
            release.wait(90)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("slow")])
        (row,) = cu_eval.run(read_tasks(str(path)), str(path.parent), str(tmp_path / "out"),
                             cu_eval.Asking(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=600),
                             samples=1, browser_path=BROWSER, viewport=(224, 224), episode_s=8.0, run_s=600)[0]
        # Timed out within the episode's limit (or, on a machine too busy to ask in 8 s, past it).
        assert row["error"] == "the model's server: timed out" or "limit" in row["error"], row["error"]
        assert row["reward"] == 0 and row["shot"]
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()

class Listener:
    """A loopback TCP port and a UDP port of the test's own that record whatever reaches them: a
    connection (a WebSocket's upgrade request, a fetch, a TURN allocation) or a datagram (STUN)."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.port, self.udp_port = self.tcp.getsockname()[1], self.udp.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.seen.append(conn.recv(200) or b"(connected)")
                except OSError:
                    self.seen.append(b"(connected)")

    def everything_seen(self) -> list[bytes]:
        """What reached either port, datagrams still queued included."""
        while True:
            try:
                self.seen.append(self.udp.recv(200))
            except BlockingIOError:
                return list(self.seen)

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


# Every way a page opens a connection that request routing does not see, each reporting when it
# is over: a WebSocket from the page, from a fresh frame's realm, from a dedicated and a shared
# worker; WebRTC's TURN over TCP and STUN over UDP; a service worker; a fetch to another port.
REACH_OUT = """<!doctype html><p id=result>{}</p><button data-name=red>red</button><script>
const port = PORT, udp = UDP, out = {};
const done = (k, v) => { out[k] = v; result.textContent = JSON.stringify(out); };
const socketIn = (name, make) => {
  try { const w = make(`ws://127.0.0.1:${port}/${name}`); w.onopen = () => done(name, "open");
        w.onclose = e => done(name, "closed " + e.code); } catch (e) { done(name, "refused " + e.name); } };
socketIn("page", url => new WebSocket(url));
const frame = document.createElement("iframe"); document.body.appendChild(frame);
socketIn("frame", url => new frame.contentWindow.WebSocket(url));
const inWorker = `const w = new WebSocket("ws://127.0.0.1:${port}/worker");
  w.onopen = () => postMessage("open"); w.onclose = () => postMessage("closed");
  onconnect = e => e.ports[0].postMessage("connected");`;
const blob = URL.createObjectURL(new Blob([inWorker], {type: "text/javascript"}));
try { const wk = new Worker(blob); wk.onmessage = e => done("worker", e.data);
      wk.onerror = () => done("worker", "refused"); } catch (e) { done("worker", "refused " + e.name); }
try { const sh = new SharedWorker(blob); sh.port.onmessage = e => done("shared", e.data);
      sh.onerror = () => done("shared", "refused"); } catch (e) { done("shared", "refused " + e.name); }
const pc = new RTCPeerConnection({iceServers: [{urls: `stun:127.0.0.1:${udp}`},
  {urls: `turn:127.0.0.1:${port}?transport=tcp`, username: "u", credential: "p"}]});
pc.createDataChannel("x");
pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") done("rtc", "gathered"); };
pc.createOffer().then(o => pc.setLocalDescription(o)).catch(e => done("rtc", "refused " + e.name));
navigator.serviceWorker.register("sw.js").then(r => done("sw", r ? "registered" : "none"),
                                               e => done("sw", "refused " + e.name))
  .then(() => navigator.serviceWorker.getRegistrations()).then(all => done("registrations", all.length));
fetch(`http://127.0.0.1:${port}/fetch`).then(() => done("fetch", "answered"), () => done("fetch", "refused"));
</script>"""
PROBES = {"page", "frame", "worker", "shared", "rtc", "sw", "registrations", "fetch"}


def test_a_task_page_reaches_nothing_but_its_own_page_server(tmp_path: Path) -> None:
    listener = Listener()
    try:
        page = REACH_OUT.replace("PORT", str(listener.port)).replace("UDP", str(listener.udp_port))
        path = tasks_file(tmp_path / "t", {"reach.html": page, "sw.js": "self.onfetch = () => {};"}, [])
        with PageServer(str(path.parent)) as server, \
                Browser(BROWSER, (224, 224), server.origin, timeout_s=60.0) as browser, \
                browser.page(server.url("pages/reach.html")) as tab:
            # Each probe says when it is over; the deadline is only for a browser that never says.
            tab.wait_for_function("(n) => Object.keys(JSON.parse(result.textContent)).length >= n",
                                  arg=len(PROBES), timeout=60_000)
            outcome = json.loads(tab.locator("#result").text_content())
        assert set(outcome) == PROBES, outcome
        # Nothing reached the test's ports (the closed network: WebRTC's TURN has no other guard) ...
        assert listener.everything_seen() == [], outcome
        # ... and each guard above it said no: the page's sockets closed by the runner (1008: policy), no
        # worker of any kind, no service worker registered, the fetch refused by the request routing.
        assert outcome["page"] == outcome["frame"] == "closed 1008", outcome
        assert outcome["worker"].startswith("refused") and outcome["shared"].startswith("refused"), outcome
        assert outcome["sw"] != "registered" and outcome["registrations"] == 0, outcome
        assert outcome["fetch"] == "refused" and outcome["rtc"] == "gathered", outcome
    finally:
        listener.close()


def test_every_wait_of_an_episode_is_within_its_one_limit(tmp_path: Path, model: Model) -> None:
    # As many assertions as a task may have, on elements the page never shows: given CHECK_S each,
    # they would hold the episode MAX_CHECKS seconds; the episode's limit is 6 s for everything.
    missing = [{"check": "text", "selector": f"#missing-{i}", "equals": "red"} for i in range(MAX_CHECKS)]
    episode_s = 6.0
    assert MAX_CHECKS * CHECK_S > episode_s
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS}, [task("many", checks=missing)])
    (many,) = run(path, tmp_path / "out", model, ["red"], episode_s=episode_s)
    waits = [a["wait_s"] for a in many["assertions"]]
    assert "limit" in (many["error"] or "") and many["reward"] == 0
    # Each missing element is waited for as long as its assertion was given, one after the other:
    # what they were given together is what the episode had left.
    assert all(0 < w <= CHECK_S for w in waits) and sum(waits) <= episode_s + 0.001 * len(waits), waits
    assert len(waits) < MAX_CHECKS and all(not a["passed"] and "Timeout" in a["error"] for a in many["assertions"])


def test_assertions_true_on_any_page_are_refused_and_the_url_is_read_from_the_page_on(tmp_path: Path,
                                                                                          model: Model) -> None:
    path = tasks_file(tmp_path / "t", {"buttons.html": BUTTONS, "my page~1.html": BUTTONS}, [
        task("empty", checks=[{"check": "url", "contains": ""}]),
        task("blank", checks=[{"check": "text", "selector": "#result", "contains": " \t"}]),
        task("own", checks=[{"check": "url", "contains": "buttons.html"}]),
        task("path", "./sub/../my page~1.html", checks=[
            {"check": "url", "equals": "/pages/my%20page~1.html#pressed-red"}])])
    rows = run(path, tmp_path / "out", model, ["red"])
    refused, path_row = rows[:3], rows[3]
    assert [r["error"].split(" (")[0] for r in refused] == ["task empty: assertion 1", "task blank: assertion 1",
                                                            "task own: assertion 1"]
    assert "asks for no text" in refused[0]["error"] and "asks for no text" in refused[1]["error"]
    assert "before any action" in refused[2]["error"] and all(r["reward"] == 0 for r in refused)
    assert path_row["reward"] == 1, path_row
    assert path_row["assertions"][0]["actual"] == "/pages/my%20page~1.html#pressed-red"
    full = path_row["url"]  # the record keeps the whole URL
    assert full.startswith("http://127.0.0.1:") and full.endswith("/pages/my%20page~1.html#pressed-red"), full
