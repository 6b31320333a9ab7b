"""The playbook's fake 0 % (§6) as the console sees it: the eval stage, run against llama-server's
own recorded replies, writes its items; the TUI checks the newest run's items once and raises
`check eval`'s problems as alerts, which resolve when a healthy run follows.

The replies are llama-server's (tests/data/eval/llama_server), replayed by a small HTTP server
that answers each request with the reply recorded for the same question and max_tokens."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from samai.console.app import SamaiApp
from samai.console.core import config
from tests.box_tools import stage_argv, stage_env
from tests.helpers import pilot_until

pytestmark = pytest.mark.slow  # every test here takes seconds: real processes, sockets or an app, waited on

RECORDED = Path(__file__).parent / "data" / "eval" / "llama_server"
PIPELINE = """
[workspace]
path = "{ws}"
[stages.eval]
key = "8"
command = 'python3 -m samai_box.stages.eval --url http://127.0.0.1:1 --data data/eval.jsonl --out runs/eval/x'
"""


def _replies(name: str) -> dict[tuple[str, int], bytes]:
    folder = RECORDED / name
    requests = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    responses = (folder / "responses.jsonl").read_bytes().splitlines()
    return {(r["messages"][-1]["content"], r["max_tokens"]): body for r, body in zip(requests, responses, strict=True)}


@pytest.fixture
def replay():
    """http://127.0.0.1:PORT answering /v1/chat/completions with the recorded reasoning split."""
    replies = _replies("reasoning_split")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = replies[(asked["messages"][-1]["content"], asked["max_tokens"])]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _eval(workspace: Path, url: str, out: str, *args: str) -> dict:
    questions = sorted({q for q, _ in _replies("reasoning_split")})
    golds = {r["messages"][-1]["content"]: r["gold"] for r in map(json.loads, (
        RECORDED / "reasoning_split" / "requests.jsonl").read_text().splitlines())}
    (workspace / "data").mkdir(exist_ok=True)
    (workspace / "data" / "eval.jsonl").write_text("".join(
        json.dumps({"id": i, "prompt": q, "gold": golds[q]}) + "\n" for i, q in enumerate(questions)))
    subprocess.run(stage_argv("stages.eval", "--url", url, "--data", "data/eval.jsonl", "--out", out, *args),
                   env=stage_env(), cwd=workspace, capture_output=True, text=True, timeout=60)
    return json.loads((workspace / out / "summary.json").read_text())


async def test_a_fake_zero_eval_is_an_alert_until_a_healthy_run_follows(tmp_path, workspace, replay) -> None:
    # The playbook's client: content alone, max_tokens too few for the thinking.
    summary = _eval(workspace, replay, "runs/eval/naive", "--max-tokens", "16", "--answer-from", "content")
    assert summary["accuracy"] == 0 and summary["empty_content"] == 8 and summary["truncated"] == 8
    cfg = tmp_path / "eval.toml"
    cfg.write_text(PIPELINE.format(ws=workspace))
    app = SamaiApp(config.load(cfg))
    async with app.run_test(size=(140, 45)) as pilot:
        fake = await pilot_until(pilot, lambda: next((a for a in app.state.alerts if a.code == "fake_zero"), None), 60)
        assert fake.severity == "error" and fake.text.startswith("eval naive: accuracy 0 % is likely fake")
        assert "--reasoning-format none" in fake.text and "raise max_tokens" in fake.text
        assert {a.code for a in app.state.active_alerts()} >= {"fake_zero", "truncation", "empty_content"}

        # The fix on the client's side: room to think and content + reasoning_content joined.
        summary = _eval(workspace, replay, "runs/eval/fixed", "--max-tokens", "64")
        assert summary["accuracy"] == 1
        await pilot_until(pilot, lambda: not any(a.active for a in app.state.alerts
                                                 if a.code in ("fake_zero", "truncation", "empty_content")), 60)
        assert app.is_running
