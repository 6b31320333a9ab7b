"""The command line against a hostile box: real processes whose command lines and real files
whose names and lines carry terminal escapes, inputs built to crash a parser, and a reader that
closes stdout early. Text output must reach the terminal inert (control characters as visible
stand-ins), --json must stay exact, `tail --raw` must pass bytes through, and every failure is
one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote.targets import TargetError, open_transport, scheme

OSC_TITLE, CLEAR, C1_CSI = "\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m"
HOSTILE = f"{OSC_TITLE}{CLEAR}{C1_CSI}\u2028-evil"  # U+2028: a line break to some terminals and editors
LISTENER = ("import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(60)")
WRITER = "import sys,time\nf=open(sys.argv[1],'a')\nf.write('x');f.flush()\nprint('ready',flush=True)\ntime.sleep(60)"


def cli(*args: str, stdout=subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess:
    """samai-console as a user runs it, its streams as bytes: what the terminal would get."""
    return subprocess.run([sys.executable, "-m", "samai.console", *args], stdout=stdout, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def assert_inert(data: bytes) -> str:
    """No byte that drives a terminal or hides text: valid UTF-8 without C0 (but newline and tab), DEL,
    C1, U+2028/9 or a format character (bidi controls, zero-width characters)."""
    text = data.decode("utf-8")  # strict: a lone C1 byte such as 0x9b is a finding too
    bad = sorted({c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")})
    assert not bad, f"control characters reach the terminal: {bad!r}"
    return text


def assert_one_line(stderr: bytes) -> str:
    text = assert_inert(stderr)
    assert text.count("\n") == 1 and text.endswith("\n") and "Traceback" not in text, text
    return text


@pytest.fixture
def cfg(tmp_path: Path, workspace: Path) -> Path:
    f = tmp_path / "hostile.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n[stages.hello]\nkey = "h"\ncommand = "echo hi"\n')
    return f


@pytest.fixture
def hostile_listener(spawn) -> subprocess.Popen:
    """A real process whose argv[0] is a terminal attack, holding a listening socket (so that
    `snapshot` lists its command line whatever its CPU use)."""
    proc = spawn(HOSTILE, "-c", LISTENER, executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip().isdigit()
    return proc


# ------------------------------------------------------------------ escapes from the box


@pytest.mark.slow
def test_snapshot_shows_a_hostile_command_line_inert_and_json_keeps_it(cfg: Path, hostile_listener) -> None:
    r = cli("--config", str(cfg), "snapshot")
    assert r.returncode == 0, r.stderr
    text = assert_inert(r.stdout)
    assert_inert(r.stderr)
    assert f"pid {hostile_listener.pid} ␛]0;pwned␇␛[2J\ufffd31m\ufffd-evil -c" in text
    r = cli("--config", str(cfg), "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.isascii()  # every control character escaped as \uXXXX, C1 and U+2028 included
    snap = json.loads(r.stdout)
    (proc,) = [p for p in snap["processes"] if p["pid"] == hostile_listener.pid]
    assert proc["argv"][0] == HOSTILE


@pytest.mark.slow
def test_tail_shows_hostile_log_lines_inert_and_raw_passes_the_bytes(cfg: Path, workspace: Path) -> None:
    data = (f"step 1 {OSC_TITLE}\n{CLEAR}cleared\nc1 {C1_CSI} red\n".encode()
            + b"lone byte \x9b[2J\nseparator \xe2\x80\xa8 del \x7f\npartial \x1b]2;x")
    (workspace / "train.log").write_bytes(data)
    r = cli("--config", str(cfg), "tail", "train.log")
    assert r.returncode == 0, r.stderr
    assert assert_inert(r.stdout).splitlines() == ["step 1 ␛]0;pwned␇", "␛[2Jcleared", "c1 \ufffd31m red",
                                                  "lone byte \ufffd[2J", "separator \ufffd del ␡",
                                                  "partial ␛]2;x"]
    raw = cli("--config", str(cfg), "tail", "train.log", "--raw")
    assert raw.returncode == 0 and raw.stdout == data  # asked for explicitly: every byte as it is
    grep = cli("--config", str(cfg), "tail", "train.log", "--raw", "--grep", "pwned|^c1 ")
    assert grep.stdout == f"step 1 {OSC_TITLE}\nc1 {C1_CSI} red\n".encode()


@pytest.mark.slow
def test_doctor_quotes_a_hostile_file_name_inert_and_json_keeps_it(cfg: Path, workspace: Path, spawn) -> None:
    target = workspace / f"{OSC_TITLE}{C1_CSI}.gguf.part"
    for _ in range(2):  # two writers in two groups: the shared-writer finding names the file
        proc = spawn(sys.executable, "-c", WRITER, str(target), stdout=subprocess.PIPE, text=True,
                     start_new_session=True)
        assert proc.stdout.readline() == "ready\n"
    r = cli("--config", str(cfg), "doctor")
    assert r.returncode == 1
    text = assert_inert(r.stdout)
    assert f"shared_writer: {workspace}/␛]0;pwned␇\ufffd31m.gguf.part is being written by 2" in text
    r = cli("--config", str(cfg), "doctor", "--json")
    assert r.stdout.isascii()
    shared = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "shared_writer"]
    assert str(target) in shared[0]["message"]


@pytest.mark.slow
def test_check_trainlog_shows_box_text_of_a_finding_inert(cfg: Path, workspace: Path) -> None:
    detail = "loss \x9b2J\x07 at step 3 \x1bx"  # C1 CSI, BEL, a lone ESC: none of it an ANSI sequence to strip
    (workspace / "train.log").write_text("{'loss': 1.5, 'grad_norm': 1.0, 'learning_rate': 1e-4, 'epoch': 0.1}\n"
                                         f"TRAIN_NAN: {detail}\n")
    r = cli("--config", str(cfg), "check", "trainlog", "train.log")
    assert r.returncode == 1
    assert "nan_guard_fired" in assert_inert(r.stdout) and "loss \ufffd2J␇ at step 3 ␛x" in r.stdout.decode()
    r = cli("--config", str(cfg), "check", "trainlog", "train.log", "--json")
    assert r.stdout.isascii()
    (guard,) = json.loads(r.stdout)["anomalies"]
    assert detail in guard["message"]


def test_an_error_line_that_quotes_box_text_is_one_inert_line(cfg: Path) -> None:
    r = cli("--config", str(cfg), "check", "eval", f"no\nsuch{CLEAR}{C1_CSI}.jsonl")
    assert r.returncode == 2
    assert "no␊such␛[2J\ufffd31m.jsonl" in assert_one_line(r.stderr)


# ------------------------------------------------------------------ one line, never a traceback


def test_deeply_nested_json_in_check_eval_is_a_malformed_line(cfg: Path, workspace: Path) -> None:
    (workspace / "items.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    r = cli("--config", str(cfg), "check", "eval", "items.jsonl")
    assert r.returncode == 1 and r.stderr == b""
    assert "no_items" in r.stdout.decode() and "malformed 1" in r.stdout.decode()


def test_deeply_nested_json_in_check_trainlog_is_one_line(cfg: Path, workspace: Path) -> None:
    (workspace / "trainer_state.json").write_text('{"log_history": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    r = cli("--config", str(cfg), "check", "trainlog", "trainer_state.json")
    assert r.returncode == 2
    assert "not a readable trainer_state.json" in assert_one_line(r.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("url", ["envelope+http://[::1", "ssh://[::1", "ssh://h:0", "envelope+http://h/%zz",
                                 "ssh://u:secret@h", "ssh://[::1]junk", "envelope+http://u:secret@h", "ssh://h\nx",
                                 f"ssh://{OSC_TITLE}"])
def test_a_malformed_target_url_is_one_line_exit_2(url: str) -> None:
    r = cli("--target", url, "snapshot")
    assert r.returncode == 2
    text = assert_one_line(r.stderr)
    assert "target" in text and "secret" not in text


@pytest.mark.slow
@given(st.one_of(st.text(max_size=60),
                 st.builds(str.__add__, st.sampled_from(["ssh://", "envelope+http://", "envelope+https://", "local"]),
                           st.text(alphabet="[]:@/%?#.-_az09 \x00\x1b\u00e9", max_size=30))))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_target_parser_raises_only_target_error(url: str) -> None:
    try:
        transport = open_transport(url)
    except TargetError:
        return
    assert transport.name == scheme(url).split("+")[0]  # the transport the URL names, nothing else


def _closed_pipe() -> int:
    """A pipe whose reader is already gone: the next write to it fails with EPIPE, every time."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


@pytest.mark.parametrize("command", [["snapshot"], ["snapshot", "--json"], ["tail", "big.log", "-n", "5000"]])
def test_a_closed_stdout_exits_quietly(cfg: Path, workspace: Path, command: list[str]) -> None:
    (workspace / "big.log").write_text("".join(f"line {i}\n" for i in range(5000)))
    write_end = _closed_pipe()
    try:
        r = cli("--config", str(cfg), *command, stdout=write_end)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (141, b"")  # as a tool that SIGPIPE ended, and nothing said


@pytest.mark.parametrize("source", ["x = " + "-" * 100_000 + "1\n", "x = 1" + " + 1" * 100_000 + "\n"],
                         ids=["unary", "binary"])
def test_lint_payload_on_a_100k_deep_expression_is_a_syntax_error_line(tmp_path: Path, source: str) -> None:
    payload = tmp_path / "deep.py"
    payload.write_text(source)
    r = cli("lint-payload", str(payload))
    assert r.returncode == 2 and r.stderr == b""
    assert r.stdout.decode() == f"{payload}:1:1: syntax-error too deeply nested for Python's parser\n"


# ------------------------------------------------------------------ nothing parseable, memory


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"", os.urandom(64 * 1024)], ids=["empty", "random"])
def test_check_trainlog_on_nothing_parseable_says_so(cfg: Path, workspace: Path, content: bytes) -> None:
    (workspace / "train.log").write_bytes(content)
    r = cli("--config", str(cfg), "check", "trainlog", "train.log")
    assert r.returncode == 1
    text = assert_inert(r.stdout)
    assert "no_training_data" in text and "no problems found" not in text
    r = cli("--config", str(cfg), "check", "trainlog", "train.log", "--json")
    assert r.returncode == 1
    assert [a["code"] for a in json.loads(r.stdout)["anomalies"]] == ["no_training_data"]


# VmHWM, not ru_maxrss: that one starts at the RSS of the (pytest) process this one was forked from.
PEAK_RSS = """
import json, os, sys
from samai.console.cli import main
sys.stdout = open(os.devnull, "w")
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps([code, peak_kb]), file=sys.stderr)
"""


@pytest.mark.slow
def test_check_trainlog_memory_does_not_grow_with_the_log(cfg: Path, workspace: Path) -> None:
    """60 MB of tqdm noise with a Trainer dict now and then: the command holds the points, not the log
    (it held every line before, well over 100 MB more than its own start-up)."""
    bar = "".join(f"\r{i:3d}%|{'█' * (i // 10):<10}| {i}/100 [00:01<00:02,  2.91it/s]" for i in range(40))
    block = "".join(f"{bar}\n" if i % 50 else f"{{'loss': {1 + 1 / (i + 1):.4f}, 'epoch': 0.1}}\n"
                    for i in range(1, 1001))
    log = workspace / "train.log"
    with open(log, "w") as f:
        while f.tell() < 60_000_000:
            f.write(block)
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, "--config", str(cfg), "check", "trainlog", str(log),
                           "--json"], capture_output=True, text=True, timeout=110)
    code, peak_kb = json.loads(done.stderr.strip().splitlines()[-1])
    assert code == 0
    assert peak_kb < 100 * 1024, f"peak RSS {peak_kb // 1024} MiB for a 60 MB log"
