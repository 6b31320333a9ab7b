"""The audit log is ASCII, one line per entry, whatever the box's text held: a killed process's
argv may carry C1 controls, U+0085 (NEL) or U+2028, which a reader or a terminal takes for a
line break or acts on."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.core.audit import AuditLog

BREAKERS = "\x85\u2028\u2029\x9b31m\x1b]0;x\x07\r\n\u202e\udcff"


@settings(max_examples=100, deadline=None, database=None)
@given(argv=st.lists(st.text(st.characters(codec=None) | st.sampled_from(BREAKERS), max_size=20), max_size=4))
def test_every_entry_is_one_ascii_line_that_reads_back(tmp_path_factory, argv: list[str]) -> None:
    log = AuditLog(tmp_path_factory.mktemp("audit") / "audit.log")
    entry_id = log.intent(action="kill", argv=argv)
    log.outcome(entry_id, ok=True, argv=argv)
    data = log.path.read_bytes()
    assert data.isascii() and data.count(b"\n") == 2 and data.endswith(b"\n")
    lines = [json.loads(line) for line in data.decode("ascii").split("\n")[:-1]]
    assert [line["phase"] for line in lines] == ["intent", "outcome"] and lines[0]["id"] == entry_id


def test_a_killed_processes_argv_with_line_breaks_stays_on_its_line(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log")
    log.record(action="kill", command=f"python3 evil{BREAKERS}.py")
    (line,) = log.path.read_bytes().splitlines()  # bytes.splitlines: \n and \r only; str's would split more
    assert line.isascii() and "\\u0085" in line.decode() and "\\u2028" in line.decode()
    assert len(log.path.read_text("ascii").splitlines()) == 1  # str.splitlines breaks at U+0085 and U+2028 too
