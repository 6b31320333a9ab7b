"""The local exec-envelope gateway (real HTTP over loopback) and the payload linter."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from samai.remote import gateway, payload_lint
from samai.remote.gateway import serve
from samai.remote.payload_lint import lint
from tests.helpers import wait_for

TOKEN = "s3cret-T0KEN-7f2a9c"
HARD_CUT_S = 2.0
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"}


@pytest.fixture
def server_log() -> io.StringIO:
    return io.StringIO()


@pytest.fixture
def server(server_log):
    with serve(TOKEN, faults=True, hard_cut_s=HARD_CUT_S, log_stream=server_log) as s:
        yield s


def execute(server, code: str | bytes, *, headers=None, timeout_s=None, respenc="b64url", client_timeout=15.0,
            path="/execute") -> httpx.Response:
    params = {}
    if respenc:
        params["respenc"] = respenc
    if timeout_s is not None:
        params["timeout"] = timeout_s
    body = code.encode() if isinstance(code, str) else code
    return httpx.post(server.url + path, params=params, content=body, headers=AUTH if headers is None else headers,
                      timeout=client_timeout)


def decoded(response: httpx.Response) -> tuple[int, bytes, bytes]:
    assert response.status_code == 200, response.text
    doc = response.json()
    return doc["rc"], base64.urlsafe_b64decode(doc["stdout"]), base64.urlsafe_b64decode(doc["stderr"])


def arm(server, **spec) -> dict:
    response = httpx.post(server.url + "/_faults", json=spec, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def raw_chunks(server, code: str) -> list[bytes]:
    """The reply body of CODE as the pieces it arrived in."""
    with httpx.stream("POST", server.url + "/execute", params={"respenc": "b64url"}, content=code.encode(),
                      headers=AUTH, timeout=15) as response:
        return list(response.iter_raw())


def marker_payload(path: Path) -> str:
    """A payload whose only visible effect is creating PATH: proves whether the code ran."""
    return f"open({str(path)!r}, 'w').close()\nprint('ran')"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Auth and secrets


def test_missing_token_is_401_and_the_code_does_not_run(server, tmp_path):
    marker = tmp_path / "ran"
    response = execute(server, marker_payload(marker), headers={"Content-Type": "text/plain"})
    assert response.status_code == 401
    assert response.json() == {"error": "unauthorized"}
    assert response.headers["www-authenticate"] == "Bearer"
    assert not marker.exists()


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN,
                                           "Bearer", f"bearer  {TOKEN} x"])
def test_wrong_token_is_401(server, tmp_path, authorization):
    marker = tmp_path / "ran"
    response = execute(server, marker_payload(marker), headers={"Authorization": authorization})
    assert response.status_code == 401
    assert not marker.exists()


def test_the_payload_cannot_read_the_token_from_its_environment(monkeypatch, server_log):
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    monkeypatch.setenv("COPY_OF_THE_TOKEN", TOKEN)  # under another name, too
    monkeypatch.setenv("UNRELATED", "kept")
    with serve(TOKEN, log_stream=server_log) as server:
        rc, out, _ = decoded(execute(server, "import os\nprint(repr(os.environ.get('SAMAI_ENVELOPE_TOKEN')))\n"
                                             "print(os.environ['UNRELATED'])\nprint(sorted(os.environ.values()))"))
    assert rc == 0
    assert out.splitlines()[:2] == [b"None", b"kept"]
    assert TOKEN.encode() not in out


@pytest.fixture
def server_process(tmp_path):
    """The server as a user runs it: `python -m samai.remote.gateway`, stderr kept in a file."""
    stderr_path = tmp_path / "server.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "samai.remote.gateway", "--port", "0", "--faults", "--hard-cut", "1"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "SAMAI_ENVELOPE_TOKEN": TOKEN})
    try:
        first_line = proc.stdout.readline()
        assert first_line.startswith("listening on http://127.0.0.1:"), first_line
        yield proc, first_line.split()[-1], stderr_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.slow
def test_the_token_never_reaches_the_server_log(server_process):
    proc, url, stderr_path = server_process
    good, bad = {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}-wrong"}
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.post("/execute", content=b"print(1)", headers=good).status_code == 200
        assert client.post("/execute", content=b"print(1)", headers=bad).status_code == 401
        assert client.post("/execute", content=b"print(1)").status_code == 401
        # A client that misplaces the token in the query or the path must not get it logged either.
        assert client.post("/execute", params={"access_token": TOKEN}, content=b"x", headers=bad).status_code == 401
        assert client.post(f"/{TOKEN}/execute", content=b"x", headers=good).status_code == 404
        assert client.post("/execute", params={"timeout": TOKEN}, content=b"x", headers=good).status_code == 400
        assert client.post("/execute", content=b"raise SystemExit(3)", headers=good).json()["rc"] == 3
        assert client.post("/execute", params={"timeout": 0.5}, content=b"import time\ntime.sleep(9)",
                           headers=good).status_code == 504
        assert client.post("/_faults", json={"mode": "500"}, headers=good).status_code == 200
        assert client.post("/execute", content=b"print(1)", headers=good).status_code == 500
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    log = stderr_path.read_text()
    assert "POST /execute timeout=1 respenc=- 200" in log  # the 1 s hard cut caps the default 60
    assert "POST /execute 401" in log and "POST - 404" in log and "fault=500" in log
    assert TOKEN not in log
    assert "Bearer" not in log


def test_no_token_configured_refuses_to_start(monkeypatch, capsys):
    monkeypatch.delenv("SAMAI_ENVELOPE_TOKEN", raising=False)
    monkeypatch.delenv("OTHER_TOKEN", raising=False)
    assert gateway.main(["--port", "0"]) == 2
    assert gateway.main(["--port", "0", "--token-env", "OTHER_TOKEN"]) == 2
    captured = capsys.readouterr()
    assert "OTHER_TOKEN" in captured.err
    assert "listening" not in captured.out


def test_a_standing_fault_needs_faults_enabled(monkeypatch, capsys):
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", TOKEN)
    assert gateway.main(["--port", "0", "--fault", "500"]) == 2
    assert "--faults" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Running payloads


def test_a_flat_payload_runs_and_its_bytes_come_back_exactly(server):
    every_byte = bytes(range(256))
    response = execute(server, "import sys\nsys.stdout.buffer.write(bytes(range(256)))\n"
                               "sys.stderr.buffer.write(b'\\xff\\xfe warn')", timeout_s=10)
    assert response.headers["content-type"] == "application/json"
    doc = response.json()
    assert list(doc) == ["rc", "stdout", "stderr", "elapsed_s"]
    assert doc["stdout"] == base64.urlsafe_b64encode(every_byte).decode()  # urlsafe alphabet, padding kept
    assert doc["stderr"] == base64.urlsafe_b64encode(b"\xff\xfe warn").decode()
    assert doc["rc"] == 0
    assert isinstance(doc["elapsed_s"], float) and 0 < doc["elapsed_s"] < 10


def test_without_respenc_the_streams_are_text_with_replacements(server):
    response = execute(server, "import sys\nsys.stdout.buffer.write(b'caf\\xc3\\xa9 \\xff')", respenc=None)
    assert response.json()["stdout"] == "caf\u00e9 \ufffd"


def test_a_payload_exception_is_still_200_with_rc_1_and_its_traceback(server):
    rc, out, err = decoded(execute(server, "print('before')\nraise ValueError('boom')"))
    assert (rc, out) == (1, b"before\n")
    assert b'File "<payload>", line 2' in err and b"ValueError: boom" in err
    assert b"<string>" not in err  # the runner's own frame is left out


def test_a_syntax_error_is_rc_1(server):
    rc, _, err = decoded(execute(server, "x = (\n"))
    assert rc == 1 and b"SyntaxError" in err


TRAPS = {
    "def body cannot see a top-level import": ("import os\ndef f():\n    return os.getpid()\nprint(f())", "'os'"),
    "comprehension cannot see a top-level name": ("k = 3\nprint([n * k for n in range(3)])", "'k'"),
    "generator expression cannot see a top-level name":
        ("limit = 1\nnames = [3, 1, 2]\nprint(sorted(x for x in names if x > limit))", "'limit'"),
    "nested functions cannot see each other":
        ("def rstr(v):\n    return str(v)\ndef rval(v):\n    return rstr(v)\nprint(rval(1))", "'rstr'"),
}


@pytest.mark.parametrize("code, missing", TRAPS.values(), ids=TRAPS.keys())
def test_the_playbook_traps_reproduce(server, code, missing):
    rc, out, err = decoded(execute(server, code))
    assert rc == 1
    assert f"NameError: name {missing} is not defined".encode() in err
    assert out == b""


def test_the_same_logic_written_flat_works(server):
    flat = "k = 3\nresult = []\nfor n in range(3):\n    result.append(n * k)\nprint(result)"
    assert decoded(execute(server, flat)) == (0, b"[0, 3, 6]\n", b"")
    assert lint(flat) == []


@pytest.mark.parametrize("code, _missing", TRAPS.values(), ids=TRAPS.keys())
def test_the_linter_catches_every_trap(code, _missing):
    assert lint(code)


def test_a_slow_payload_does_not_block_other_requests(server, tmp_path):
    started, release = tmp_path / "slow-started", tmp_path / "release"
    # The slow payload waits (30 s at most) for a file that only the quick one creates: served one at a time,
    # the quick one would run only after the slow one gave up.
    slow_code = (f"import os, time\nopen({str(started)!r}, 'w').close()\n"
                 f"for _ in range(600):\n    if os.path.exists({str(release)!r}):\n        break\n"
                 f"    time.sleep(0.05)\nprint('released' if os.path.exists({str(release)!r}) else 'never released')")
    slow: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: slow.append(execute(server, slow_code, timeout_s=60, client_timeout=90)))
    thread.start()
    wait_for(started.exists, timeout=30)
    assert decoded(execute(server, f"open({str(release)!r}, 'w').close()\nprint('quick')"))[1] == b"quick\n"
    thread.join(timeout=90)
    assert decoded(slow[0])[1] == b"released\n"


# ---------------------------------------------------------------------------------------------------------------
# Timeouts


@pytest.mark.slow
def test_a_timeout_answers_504_and_kills_the_child_and_its_grandchild(server, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    duration = f"300.{uuid.uuid4().int % 10**9}"  # a command line no other run shares
    code = ("import os, subprocess, time\n"
            f"sleeper = subprocess.Popen(['sleep', {duration!r}])\n"
            f"open({str(pid_file)!r}, 'w').write(str(sleeper.pid) + ' ' + str(os.getpid()))\n"
            "time.sleep(300)\n")
    started = time.monotonic()
    response = execute(server, code, timeout_s=1)  # the client waits 15 s: only a server that ignored it hangs
    assert response.status_code == 504
    assert response.json() == {"error": "timeout", "after_s": 1.0}
    assert time.monotonic() - started >= 1.0
    grandchild, child = (int(pid) for pid in pid_file.read_text().split())
    wait_for(lambda: not alive(grandchild) and not alive(child), timeout=5)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", duration]]
    assert [p for p in leftovers if alive(p.pid)] == []


@pytest.mark.slow
def test_a_detached_process_outlives_the_request_and_does_not_hold_the_reply(server, tmp_path):
    pid_file = tmp_path / "fired.pid"
    code = ("import subprocess\n"
            "p = subprocess.Popen(['sleep', '30.417'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "print('FIRED')")
    # The fired process holds the child's stdout for 30 s: a server that waited for it would answer 504 at 10 s.
    rc, out, _ = decoded(execute(server, code, timeout_s=10))
    assert (rc, out) == (0, b"FIRED\n")
    fired = int(pid_file.read_text())
    try:
        assert alive(fired)
    finally:
        os.kill(fired, signal.SIGKILL)


@pytest.mark.slow
def test_the_hard_cut_caps_a_larger_timeout(server):
    # The payload sleeps 30 s and the client waits 15: only the hard cut answers in time.
    response = execute(server, "import time\ntime.sleep(30)", timeout_s=100)
    assert response.status_code == 504
    assert response.json() == {"error": "timeout", "after_s": HARD_CUT_S}


@pytest.mark.parametrize("timeout_s", ["abc", "0", "-1", "nan", "inf"])
def test_a_bad_timeout_is_400(server, timeout_s):
    response = execute(server, "print(1)", timeout_s=timeout_s)
    assert response.status_code == 400 and "timeout" in response.json()["error"]


def test_an_unknown_respenc_is_400(server):
    assert execute(server, "print(1)", respenc="hex").status_code == 400


# ---------------------------------------------------------------------------------------------------------------
# Limits and routing


def test_a_body_over_the_limit_is_413_and_one_at_the_limit_runs(server):
    limit = gateway.DEFAULT_MAX_BODY
    at_limit = b"print('ok')\n#" + b"x" * (limit - 13)
    assert len(at_limit) == limit
    assert decoded(execute(server, at_limit)) == (0, b"ok\n", b"")
    response = execute(server, at_limit + b"x")
    assert response.status_code == 413
    assert response.json() == {"error": "body too large", "max_bytes": limit}


def test_max_body_is_configurable(server_log):
    with serve(TOKEN, max_body=100, log_stream=server_log) as small:
        assert execute(small, "#" * 101).status_code == 413
        assert execute(small, "#" * 100).status_code == 200


def test_wrong_path_is_404_and_wrong_method_is_405(server):
    assert execute(server, "print(1)", path="/exec").status_code == 404
    assert execute(server, "print(1)", path="/execute/").status_code == 404
    response = httpx.get(server.url + "/execute", headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert httpx.put(server.url + "/execute", headers=AUTH, content=b"print(1)").status_code == 405


def test_the_prefix_moves_the_endpoints(server_log):
    with serve(TOKEN, prefix="gw/", log_stream=server_log) as prefixed:
        assert decoded(execute(prefixed, "print(1)", path="/gw/execute"))[1] == b"1\n"
        assert execute(prefixed, "print(1)").status_code == 404


def test_without_faults_there_is_no_control_endpoint(server_log):
    with serve(TOKEN, log_stream=server_log) as plain:
        assert httpx.post(plain.url + "/_faults", json={"mode": "500"}, headers=AUTH).status_code == 404
        assert execute(plain, "print(1)").status_code == 200


def test_the_connection_is_reused_between_requests(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as client:
        first = client.post("/execute", content=b"print(1)", params={"respenc": "b64url"})
        second = client.post("/execute", content=b"print(2)", params={"respenc": "b64url"})
    assert (decoded(first)[1], decoded(second)[1]) == (b"1\n", b"2\n")


# ---------------------------------------------------------------------------------------------------------------
# Fault injection


def test_the_control_endpoint_needs_the_token_and_a_known_mode(server):
    assert httpx.post(server.url + "/_faults", json={"mode": "500"}).status_code == 401
    for bad in ({"mode": "explode"}, {"mode": "500", "count": 0}, {"mode": "500", "count": 1.5}, {"mode": "500",
                "after": -1}, {"mode": "500", "colour": "red"}, [1]):
        assert httpx.post(server.url + "/_faults", json=bad, headers=AUTH).status_code == 400, bad
    assert httpx.post(server.url + "/_faults", content=b"{not json", headers=AUTH).status_code == 400
    assert httpx.get(server.url + "/_faults", headers=AUTH).json() == {"queued": [], "standing": None}


def test_500_applies_to_one_request_only(server, tmp_path):
    arm(server, mode="500")
    marker = tmp_path / "ran"
    response = execute(server, marker_payload(marker))
    assert response.status_code == 500
    assert not marker.exists()
    assert decoded(execute(server, marker_payload(marker)))[1] == b"ran\n"


def test_503_carries_retry_after(server):
    arm(server, mode="503", retry_after_s=7)
    response = execute(server, "print(1)")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert execute(server, "print(1)").status_code == 200


@pytest.mark.slow
def test_hang_answers_nothing_until_the_hard_cut(server, tmp_path):
    arm(server, mode="hang")
    marker = tmp_path / "ran"
    with pytest.raises(httpx.ReadTimeout):
        execute(server, marker_payload(marker), client_timeout=0.5)
    started = time.monotonic()
    arm(server, mode="hang")
    response = execute(server, marker_payload(marker), timeout_s=60)  # the client waits 15 s, the hard cut is 2
    assert time.monotonic() - started >= HARD_CUT_S - 0.1
    assert response.status_code == 504 and response.json() == {"error": "timeout", "after_s": HARD_CUT_S}
    assert not marker.exists()
    assert execute(server, "print(1)").status_code == 200


@pytest.mark.slow
def test_trickle_sends_the_reply_one_byte_at_a_time(server):
    delay_s = 0.005
    arm(server, mode="trickle", delay_s=delay_s)
    started = time.monotonic()
    chunks = raw_chunks(server, "print('slow')")
    body = b"".join(chunks)
    assert len(chunks) > len(body) / 2  # arrived in dribbles, not in one piece
    assert time.monotonic() - started >= len(body) * delay_s
    assert decoded(httpx.Response(200, content=body))[1] == b"slow\n"
    chunks = raw_chunks(server, "print(1)")  # the fault is spent: the next reply comes in one piece
    assert len(chunks) < len(b"".join(chunks)) / 2


def test_close_mid_body_loses_the_reply_of_code_that_ran(server, tmp_path):
    arm(server, mode="close_mid_body")
    marker = tmp_path / "ran"
    with pytest.raises(httpx.RemoteProtocolError):
        execute(server, marker_payload(marker))
    assert marker.exists()  # it ran: why a POST must never be retried blindly
    assert execute(server, "print(1)").status_code == 200


def test_silent_spawn_answers_success_without_running(server, tmp_path):
    arm(server, mode="silent_spawn")
    marker = tmp_path / "ran"
    assert decoded(execute(server, marker_payload(marker))) == (0, b"", b"")
    assert not marker.exists()
    assert decoded(execute(server, marker_payload(marker)))[1] == b"ran\n"
    assert marker.exists()


def test_a_fault_can_target_the_nth_request_for_k_requests(server):
    plan = arm(server, mode="500", after=1, count=2)
    assert [step["mode"] for step in plan["queued"]] == ["none", "500"]
    statuses = [execute(server, "print(1)").status_code for _ in range(4)]
    assert statuses == [200, 500, 500, 200]
    assert httpx.get(server.url + "/_faults", headers=AUTH).json()["queued"] == []


def test_queued_faults_run_in_order_and_delete_clears_them(server):
    arm(server, mode="503")
    arm(server, mode="500")
    assert [execute(server, "print(1)").status_code for _ in range(3)] == [503, 500, 200]
    arm(server, mode="500", count=5)
    assert httpx.delete(server.url + "/_faults", headers=AUTH).json()["queued"] == []
    assert execute(server, "print(1)").status_code == 200


def test_faults_skip_requests_that_fail_auth(server):
    arm(server, mode="500")
    assert execute(server, "print(1)", headers={}).status_code == 401
    assert execute(server, "print(1)").status_code == 500


def test_a_standing_fault_hits_every_request(server_log):
    with serve(TOKEN, faults=True, fault="503", log_stream=server_log) as failing:
        assert [execute(failing, "print(1)").status_code for _ in range(2)] == [503, 503]
        failing.faults.arm("silent_spawn")  # the in-process side of POST /_faults; the queue goes first
        assert execute(failing, "print(1)").status_code == 200
        assert execute(failing, "print(1)").status_code == 503


def test_stopping_the_server_releases_a_hanging_request(server_log):
    with serve(TOKEN, faults=True, hard_cut_s=60, log_stream=server_log) as hanging:
        hanging.faults.arm("hang")
        errors: list[Exception] = []

        def call():
            try:
                execute(hanging, "print(1)", client_timeout=90)
            except httpx.HTTPError as e:
                errors.append(e)

        thread = threading.Thread(target=call)
        thread.start()
        wait_for(lambda: hanging.faults.describe()["queued"] == [], timeout=30)  # the request took the hang
    thread.join(timeout=90)
    assert not thread.is_alive()
    # Closed without a reply: not the client giving up, not the 504 the hard cut would have sent.
    assert [type(e) for e in errors] == [httpx.RemoteProtocolError]


# ---------------------------------------------------------------------------------------------------------------
# The payload linter


RULE_CASES = {
    "no-def": ("import os\nfor i in range(2):\n    def f():\n        return 1\n", 3),
    "no-def (async)": ("x = 1\nasync def g():\n    return x\n", 2),
    "no-lambda": ("items = [2, 1]\n\nitems.sort(key=lambda v: -v)\n", 3),
    "no-class": ("import os\nif os.name:\n    class Box:\n        pass\n", 3),
    "no-comprehension": ("xs = [1]\nys = {x: x for x in xs}\n", 2),
    "no-comprehension (set)": ("xs = [1]\nwith open('/dev/null') as f:\n    ys = {x for x in xs}\n", 3),
    "no-genexp": ("xs = [1]\ntry:\n    pass\nexcept OSError:\n    total = sum(x for x in xs)\n", 5),
    "import-where-used": ("print('a')\nfor i in range(2):\n    print(json.dumps(i))\n", 3),
}


@pytest.mark.parametrize("source, line", RULE_CASES.values(), ids=RULE_CASES.keys())
def test_each_rule_is_flagged_at_its_line(source, line, request):
    rule = request.node.callspec.id.split(" ")[0]
    violations = lint(source)
    assert [(v.rule, v.line) for v in violations] == [(rule, line)]


def test_a_clean_flat_payload_passes():
    flat = ("import json, os, subprocess\n"
            "rows = []\n"
            "for name in sorted(os.listdir('/tmp')):\n"
            "    if name.startswith('k8b'):\n"
            "        rows.append({'name': name, 'size': len(name)})\n"
            "try:\n"
            "    out = subprocess.run(['true'], capture_output=True).returncode\n"
            "except OSError as err:\n"
            "    out = str(err)\n"
            "with open('/dev/null') as f:\n"
            "    f.read()\n"
            "print(json.dumps({'rows': rows, 'out': out, 'me': __name__}))\n")
    assert lint(flat) == []


def test_an_unknown_name_is_reported_once_at_its_first_use():
    violations = lint("print(os.getpid())\nprint(os.sep)\n")
    assert [(v.line, v.col, v.rule) for v in violations] == [(1, 7, "import-where-used")]
    assert "'os'" in violations[0].message
    assert lint("import os.path\nprint(os.getpid())") == []
    assert lint("from x import *\nprint(anything)") == []  # star imports make names unknowable


def test_lint_payload_exit_codes(tmp_path, capsys):
    clean, dirty, broken = tmp_path / "clean.py", tmp_path / "dirty.py", tmp_path / "broken.py"
    clean.write_text("import os\nprint(os.getpid())\n")
    dirty.write_text("import os\nk = 3\nprint([n * k for n in range(3)])\n")
    broken.write_text("print('unclosed'\n")
    assert payload_lint.main([str(clean)]) == 0
    assert capsys.readouterr().out == ""
    assert payload_lint.main([str(dirty)]) == 1
    assert capsys.readouterr().out.startswith(f"{dirty}:3:7: no-comprehension ")
    assert payload_lint.main([str(broken)]) == 2
    assert f"{broken}:1:" in capsys.readouterr().out
    assert payload_lint.main([str(tmp_path / "missing.py")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert payload_lint.main([str(clean), str(dirty), str(tmp_path / "missing.py")]) == 2


def test_lint_payload_runs_as_a_command(tmp_path):
    dirty = tmp_path / "dirty.py"
    dirty.write_text("def f():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "samai.remote.payload_lint", str(dirty)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stdout.startswith(f"{dirty}:1:1: no-def ")
