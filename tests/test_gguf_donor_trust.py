"""Trust in what a GGUF surgery reads and where it writes (issue 29): the write is of exactly
what was planned (each source pinned by its size, validators and header sha256), integers in a
donor's reply headers are bounded, redirects keep to the donor's host and never leave https,
OUT.part and OUT are only ever created new, and a bad argument is a usage error. Through the
real box tool, real HTTP(S) servers on loopback, the action layer and the CLI; the input is a
real llama.cpp vocab GGUF."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.actions import ActionOutcome, Actions, Decision
from samai.console.core.audit import AuditLog
from samai.remote.box import gguf_source, gguf_surgery
from samai.remote.box.gguf_check import check_file
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import GgufWriteResult
from tests.helpers import run_cli
from tests.httpfiles import FileServer, self_signed

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
WRITE_TIMEOUT = 120.0
SMALL = 224  # the donor tensor's bytes when planned (the numbers)
BIG = 32 * 1024 * 1024  # and when the donor was fetched again for the write


@pytest.fixture(scope="module")
def vocab() -> Path:
    from tests.gguf_artifacts import llama_vocab_files

    return next(p for p in llama_vocab_files() if p.name == "ggml-vocab-llama-spm.gguf")


@pytest.fixture(scope="module")
def other_vocab() -> Path:
    from tests.gguf_artifacts import llama_vocab_files

    return next(p for p in llama_vocab_files() if p.name == "ggml-vocab-phi-3.gguf")


@pytest.fixture
def base(workspace: Path, vocab: Path) -> str:
    shutil.copy(vocab, workspace / "base.gguf")
    return "base.gguf"


@pytest.fixture
def served(tmp_path: Path) -> Path:
    folder = tmp_path / "served"
    folder.mkdir()
    write_donor(folder / "donor.gguf", SMALL)
    return folder


def write_donor(path: Path, nbytes: int) -> Path:
    """A donor GGUF whose one tensor, donor.w, holds nbytes of F32."""
    w = GGUFWriter(str(path), "llama")
    w.add_name("donor")
    w.add_tensor("donor.w", np.arange(nbytes // 4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


async def write(box: Box, **request) -> GgufWriteResult:
    return await box.gguf_write(request, timeout=WRITE_TIMEOUT)


def graft(donor: str, out: str = "out.gguf", **more) -> dict:
    return {"op": "add_tensors", "path": "base.gguf", "donor": donor, "tensors": ["donor.w"], "out": out, **more}


async def planned_then_changed(box: Box, tmp_path: Path, workspace: Path, request: dict, change,
                               override: bool = False) -> ActionOutcome:
    """The surgery through the action layer; change() runs after the plan is shown, before the
    operator confirms it (or overrides its block): what the box then writes must be what the
    plan said."""
    cfg_file = tmp_path / "surgery.toml"
    cfg_file.write_text(f'[workspace]\npath = "{workspace}"\n')

    async def operator(plan):
        assert plan.blocked == override, plan.checks
        change()
        return Decision.override(plan, "--force --yes") if override else Decision.confirmed(plan, "test")

    actions = Actions(box, config.load(str(cfg_file)), AuditLog(tmp_path / "audit.jsonl"), readonly=False,
                      confirm=operator)
    return await actions.gguf(request)


def data_start(path: Path) -> int:
    return check_file(str(path))["data_start"]


def flip_last_byte(path: Path) -> None:
    """The file's bytes changed where it is (same inode, same size), its mtime moved on."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def assert_nothing_written(workspace: Path, out: str = "out.gguf") -> None:
    assert not (workspace / out).exists() and not (workspace / f"{out}.part").exists()


# ------------------------------------------------------------------------------------------------
# Item 3: the write is of exactly what was planned


@pytest.mark.slow
@pytest.mark.parametrize("change", ["swapped, with validators", "swapped, no validators", "bytes changed in place"])
async def test_a_url_donor_that_changed_since_the_plan_is_refused_with_the_difference(
        box: Box, tmp_path: Path, workspace: Path, base: str, served: Path, change: str) -> None:
    donor = served / "donor.gguf"
    planned_size = donor.stat().st_size
    bigger = write_donor(tmp_path / "bigger.gguf", BIG)
    validators = change != "swapped, no validators"
    marks: list[int] = []
    with FileServer(served, etag=validators, last_modified=validators) as server:
        def donor_changes() -> None:
            if change.startswith("swapped"):
                os.replace(bigger, donor)
            else:
                flip_last_byte(donor)
            marks.append(len(server.requests))

        outcome = await planned_then_changed(box, tmp_path, workspace, graft(server.url("donor.gguf")), donor_changes)
        at_write = server.requests[marks[0]:]
    assert not outcome.ok and outcome.status == "refused", outcome.message
    assert server.url("donor.gguf") in outcome.message and "changed since the plan" in outcome.message
    if validators:
        assert "ETag was" in outcome.message, outcome.message
    else:
        assert f"size was {planned_size}, now {donor.stat().st_size}" in outcome.message, outcome.message
    assert_nothing_written(workspace)
    assert outcome.result.fetched < 1024 * 1024  # the 32 MiB were never asked for
    assert at_write and all(int(r.split("=")[1].split("-")[0]) < data_start(donor) for _, r, _ in at_write)


@pytest.mark.slow
@pytest.mark.parametrize("change", ["donor swapped", "donor bytes changed in place", "input swapped"])
async def test_a_file_that_changed_since_the_plan_is_refused_with_the_difference(
        box: Box, tmp_path: Path, workspace: Path, base: str, other_vocab: Path, change: str) -> None:
    donor = write_donor(workspace / "donor.gguf", SMALL)
    before = {"donor": donor.stat(), "input": (workspace / base).stat()}

    def file_changes() -> None:
        if change == "donor swapped":
            os.replace(write_donor(workspace / "bigger.gguf", BIG), donor)
        elif change == "input swapped":
            shutil.copy(other_vocab, workspace / "other.gguf")
            os.replace(workspace / "other.gguf", workspace / base)
        else:
            flip_last_byte(donor)

    outcome = await planned_then_changed(box, tmp_path, workspace, graft("donor.gguf"), file_changes)
    assert not outcome.ok and outcome.status == "refused", outcome.message
    assert "changed since the plan" in outcome.message
    changed = workspace / (base if change == "input swapped" else "donor.gguf")
    assert str(changed) in outcome.message or changed.name in outcome.message
    if change == "donor bytes changed in place":
        assert f"mtime_ns was {before['donor'].st_mtime_ns}" in outcome.message, outcome.message
    else:
        was = before["input" if change == "input swapped" else "donor"]
        assert f"inode was {was.st_ino}" in outcome.message, outcome.message
    assert_nothing_written(workspace)


@pytest.mark.parametrize("server", ["honours If-Match", "ignores If-Match"])
async def test_a_url_donor_that_changes_between_its_header_and_its_tensor_is_refused(
        box: Box, workspace: Path, base: str, served: Path, server: str) -> None:
    """Within one write: the header read, then the donor changes before its tensor's range is asked."""
    with FileServer(served, conditions=server == "honours If-Match") as files:
        files.hold(after=1)  # the first range goes through, the tensor's waits
        running = asyncio.create_task(write(box, **graft(files.url("donor.gguf"))))
        assert await asyncio.to_thread(files.held.wait, 60)
        flip_last_byte(served / "donor.gguf")
        files.release()
        result = await running
    assert not result.ok and "changed while it was read" in result.error and "ETag was" in result.error, result.error
    assert_nothing_written(workspace)


async def test_an_override_never_writes_what_the_box_refused_to_plan(box: Box, tmp_path: Path, workspace: Path,
                                                                    base: str) -> None:
    """No donor at the plan (the box refuses it, nothing pinned); one appears before --force."""
    outcome = await planned_then_changed(box, tmp_path, workspace, graft("donor.gguf"),
                                         lambda: write_donor(workspace / "donor.gguf", BIG), override=True)
    assert not outcome.ok and outcome.status == "refused", outcome.message
    assert "refused to plan it" in outcome.message
    assert_nothing_written(workspace)


def test_a_write_whose_pin_is_not_what_the_tool_finds_is_refused(tmp_path: Path, vocab: Path) -> None:
    """The pin the console sends back (from the plan) is compared in full: output size, ranges."""
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(vocab, ws / "base.gguf")
    write_donor(ws / "donor.gguf", SMALL)
    request = {**graft("donor.gguf"), "workspace": str(ws)}
    plan = gguf_surgery.handle({**request, "plan": True})
    assert plan["ok"], plan
    pin = plan["pin"]
    [(index, start, length)] = pin["reads"]
    tampered = {"bytes": {**pin, "bytes": pin["bytes"] + 32 * 1024 * 1024},
                "reads": {**pin, "reads": [[index, start, length * 1000]]}}
    for what, wrong in tampered.items():
        reply = gguf_surgery.handle({**request, "pin": wrong})
        assert reply["ok"] is False and "the plan" in reply["failure"] and what in reply["failure"], reply
    assert_nothing_written(ws)
    done = gguf_surgery.handle({**request, "pin": pin})
    assert done["ok"], done
    assert (ws / "out.gguf").stat().st_size == pin["bytes"] == plan["bytes"]


# ------------------------------------------------------------------------------------------------
# Item 7: every integer in a reply header is bounded


HEADER_CASES = {
    "a Content-Range total of 5000 digits": ("Content-Range", "bytes 0-{last}/" + "9" * 5000),
    "a Content-Range start of 5000 digits": ("Content-Range", "bytes " + "0" * 5000 + "-{last}/{size}"),
    "a Content-Range past any file": ("Content-Range", "bytes 0-{last}/" + "9" * 19),
    "a negative Content-Range end": ("Content-Range", "bytes 0--1/{size}"),
    "a Content-Length of 5000 digits": ("Content-Length", "9" * 5000),
    "a Content-Length that is not the range's": ("Content-Length", "7"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", HEADER_CASES)
async def test_a_donor_whose_reply_header_holds_an_absurd_integer_is_a_refused_donor(
        box: Box, tmp_path: Path, workspace: Path, base: str, served: Path, case: str) -> None:
    header, template = HEADER_CASES[case]
    size = (served / "donor.gguf").stat().st_size
    cfg = tmp_path / "surgery.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    with FileServer(served) as server:
        server.override[header] = template.format(last=size - 1, size=size)
        url = server.url("donor.gguf")
        result = await write(box, **graft(url))
        cli = run_cli("--config", str(cfg), "gguf", "add-tensors", base, "--from", url, "--tensor", "donor.w",
                      "--out", "cli.gguf", "--yes")
        show = run_cli("--config", str(cfg), "gguf", "show", url)
    assert not result.ok and url in result.error and header in result.error, result.error
    assert len(result.error) < 600  # the digits are not repeated back
    assert cli.returncode == 1, cli.stderr
    assert url in cli.stderr and "cannot reach" not in cli.stderr and "Traceback" not in cli.stderr
    assert show.returncode == 1 and header in show.stderr and "cannot reach" not in show.stderr, show.stderr
    assert_nothing_written(workspace)
    assert_nothing_written(workspace, "cli.gguf")


DIGITS = st.one_of(st.text("0123456789", min_size=1, max_size=40), st.integers(4000, 6000).map("9".__mul__))
NUMBER = st.one_of(st.integers(-(10 ** 30), 10 ** 30).map(str), DIGITS, st.sampled_from(["", "+1", " 1", "0x10", "*"]))
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=60)
CONTENT_RANGE = st.one_of(st.builds("bytes {}-{}/{}".format, NUMBER, NUMBER, NUMBER), HEADER_TEXT,
                          st.builds("bytes {}-{}/{}".format, st.just("0"), NUMBER, NUMBER))


@FUZZ
@given(text=st.one_of(CONTENT_RANGE, DIGITS))
def test_the_content_range_parser_bounds_every_number(text: str) -> None:
    try:
        start, end, total = gguf_source.parse_content_range(text)
    except gguf_source.SourceError as e:
        assert len(str(e)) < 300
    else:
        assert 0 <= start <= end < total <= gguf_source.MAX_SOURCE_SIZE


@pytest.mark.slow
@FUZZ
@given(header=st.sampled_from(["Content-Range", "Content-Length"]), value=st.one_of(CONTENT_RANGE, NUMBER))
def test_fuzzed_range_headers_from_a_real_server_are_a_named_refusal(
        tmp_path_factory: pytest.TempPathFactory, vocab: Path, header: str, value: str) -> None:
    ws = tmp_path_factory.mktemp("ws")
    shutil.copy(vocab, ws / "base.gguf")
    served = tmp_path_factory.mktemp("served")
    write_donor(served / "donor.gguf", SMALL)
    with FileServer(served) as server:
        server.override[header] = value
        url = server.url("donor.gguf")
        reply = gguf_surgery.handle({**graft(url), "workspace": str(ws)})
    assert isinstance(reply, dict) and "error" not in reply, reply
    if reply["ok"]:
        assert check_file(str(ws / "out.gguf"))["ok"]
    else:
        assert url in reply["failure"] and len(reply["failure"]) < 600, reply["failure"]
        assert_nothing_written(ws)


# ------------------------------------------------------------------------------------------------
# Item 8: redirects keep to the donor's host, and never leave https


@pytest.mark.slow
async def test_a_redirect_to_another_host_is_refused_unless_that_host_is_allowed(
        box: Box, workspace: Path, base: str, served: Path) -> None:
    with FileServer(served) as server:
        server.redirects["/moved.gguf"] = server.url("donor.gguf", host="localhost")
        server.redirects["/renamed.gguf"] = "/donor.gguf"
        server.redirects["/loop.gguf"] = "/loop.gguf"
        server.redirects["/ftp.gguf"] = "ftp://127.0.0.1/donor.gguf"
        moved = server.url("moved.gguf")
        refused = await write(box, **graft(moved, "a.gguf"))
        allowed = await write(box, **graft(moved, "b.gguf", redirect_hosts=["localhost"]))
        same_host = await write(box, **graft(server.url("renamed.gguf"), "c.gguf"))
        loop = await write(box, **graft(server.url("loop.gguf"), "d.gguf"))
        ftp = await write(box, **graft(server.url("ftp.gguf"), "e.gguf"))
        with pytest.raises(BoxError, match="another host"):
            await box.gguf_show(moved)
        shown = await box.gguf_show(moved, redirect_hosts=["localhost"])
    assert not refused.ok and refused.fetched == 0, refused
    assert "another host" in refused.error and "localhost" in refused.error and "--allow-redirect" in refused.error
    assert allowed.ok, allowed.error
    assert same_host.ok, same_host.error
    assert shown.ok and [t.name for t in shown.tensors] == ["donor.w"]
    assert not loop.ok and "redirect" in loop.error, loop.error
    assert not ftp.ok and "ftp://" in ftp.error, ftp.error
    for out in ("a.gguf", "d.gguf", "e.gguf"):
        assert_nothing_written(workspace, out)
    assert check_file(str(workspace / "b.gguf"))["ok"] and check_file(str(workspace / "c.gguf"))["ok"]


@pytest.mark.slow
async def test_an_https_donor_that_redirects_to_plain_http_is_refused(
        box: Box, tmp_path: Path, workspace: Path, base: str, served: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    certificate, key = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # the box tool trusts our certificate, as a CA
    with FileServer(served) as plain, FileServer(served, tls=(certificate, key)) as secure:
        secure.redirects["/moved.gguf"] = plain.url("donor.gguf")  # the same host, plain http
        direct = await write(box, **graft(secure.url("donor.gguf"), "tls.gguf"))
        downgraded = await write(box, **graft(secure.url("moved.gguf"), "plain.gguf"))
        asked_in_plain = plain.gets("donor.gguf")
    assert direct.ok, direct.error  # https itself works, certificate verified
    assert not downgraded.ok and "plain http" in downgraded.error, downgraded.error
    assert asked_in_plain == [] and downgraded.fetched == 0
    assert_nothing_written(workspace, "plain.gguf")


def test_the_redirect_rule() -> None:
    refusal = gguf_source.redirect_refusal
    assert refusal("https://a.example/x", "https://a.example/y", ()) is None
    assert refusal("http://a.example/x", "https://a.example:8443/y", ()) is None  # an upgrade, same host
    assert "plain http" in refusal("https://a.example/x", "http://a.example/x", ("a.example",))
    assert "another host" in refusal("https://a.example/x", "https://b.example/x", ())
    assert refusal("https://a.example/x", "https://B.example/x", ("b.example",)) is None
    for elsewhere in ("file:///etc/passwd", "ftp://a.example/x", "data:,GGUF", "gopher://a.example/"):
        assert "not an http(s) URL" in refusal("https://a.example/x", elsewhere, ("a.example",))
    for broken in ("https://a.example:99999/x", "https://a.example:" + "9" * 5000 + "/x", "https://[::1/x"):
        assert "not a URL" in refusal("https://a.example/x", broken, ())


# ------------------------------------------------------------------------------------------------
# Item 9: OUT.part and OUT are created new, never written through


@pytest.mark.parametrize("placed", ["a hard link at OUT.part", "a symlink at OUT.part", "a hard link at OUT",
                                    "a symlink at OUT"])
async def test_a_link_placed_while_the_donor_stalls_is_never_written_through_nor_replaced(
        box: Box, tmp_path: Path, workspace: Path, base: str, served: Path, placed: str) -> None:
    victim = tmp_path / "victim.txt"  # outside the workspace
    victim.write_bytes(b"precious")
    at = workspace / ("out.gguf.part" if placed.endswith("OUT.part") else "out.gguf")
    with FileServer(served) as server:
        server.hold()  # the donor stalls on its first range: OUT was checked, nothing is written yet
        running = asyncio.create_task(write(box, **graft(server.url("donor.gguf"))))
        assert await asyncio.to_thread(server.held.wait, 60)
        if "hard link" in placed:
            os.link(victim, at)
        else:
            at.symlink_to(victim)
        server.release()
        result = await running
    assert not result.ok and at.name in result.error and "appeared" in result.error, result.error
    assert victim.read_bytes() == b"precious"
    assert at.is_symlink() if "symlink" in placed else at.samefile(victim)  # left as it was placed
    ours = workspace / ("out.gguf" if at.name.endswith(".part") else "out.gguf.part")
    assert not ours.exists() and not ours.is_symlink()


async def test_a_stale_out_part_of_an_earlier_run_is_refused_and_left_alone(box: Box, workspace: Path,
                                                                           base: str) -> None:
    (workspace / "out.gguf.part").write_bytes(b"half of an earlier run")
    result = await write(box, op="set_kv", path=base, set={"general.name": "x"}, out="out.gguf")
    assert not result.ok and "out.gguf.part" in result.error and "earlier run" in result.error, result.error
    assert (workspace / "out.gguf.part").read_bytes() == b"half of an earlier run"
    assert not (workspace / "out.gguf").exists()


# ------------------------------------------------------------------------------------------------
# Item 16: a bad argument is a usage error or a refusal, never "cannot reach the target"


BAD_ARGUMENTS = {
    "an empty --out": (["set-kv", "base.gguf", "general.name=x", "--out", ""], 2, "--out"),
    "an --out that names a folder": (["set-kv", "base.gguf", "general.name=x", "--out", "models/"], 2, "folder"),
    "an --out that is a folder": (["set-kv", "base.gguf", "general.name=x", "--out", "models"], 1, "folder"),
    "an --out outside the workspace": (["set-kv", "base.gguf", "general.name=x", "--out", "../x.gguf"], 1,
                                       "outside the workspace"),
    "an empty input": (["set-kv", "", "general.name=x", "--out", "x.gguf"], 2, "input"),
    "an empty --tensor": (["extract", "base.gguf", "--tensor", "", "--out", "x.gguf"], 2, "--tensor"),
    "an empty --from": (["add-tensors", "base.gguf", "--from", "", "--tensor", "donor.w", "--out", "x.gguf"], 2,
                        "--from"),
    "an empty key": (["set-kv", "base.gguf", "=x", "--out", "x.gguf"], 2, "KEY=VALUE"),
    "an empty --expect-last": (["add-tensors", "base.gguf", "--from", "base.gguf", "--tensor", "t", "--out",
                                "x.gguf", "--expect-last", ""], 2, "--expect-last"),
    "a negative --expect-tensors": (["add-tensors", "base.gguf", "--from", "base.gguf", "--tensor", "t", "--out",
                                     "x.gguf", "--expect-tensors", "-1"], 2, "--expect-tensors"),
    "an empty --allow-redirect": (["extract", "base.gguf", "--tensor", "t", "--out", "x.gguf", "--allow-redirect",
                                   ""], 2, "--allow-redirect"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_a_bad_gguf_argument_is_named_never_a_transport_error(tmp_path: Path, workspace: Path, base: str,
                                                              case: str) -> None:
    argv, code, named = BAD_ARGUMENTS[case]
    (workspace / "models").mkdir()
    cfg = tmp_path / "surgery.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    done = run_cli("--config", str(cfg), "gguf", *argv, "--yes")
    assert done.returncode == code, done.stderr
    assert named in done.stderr and "cannot reach" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    if code == 2:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(p.name for p in workspace.iterdir() if p.name != ".samai") == ["base.gguf", "models"]  # .samai: tools
