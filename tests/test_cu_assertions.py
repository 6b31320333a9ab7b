"""A task's assertions as untrusted input: one that holds without the right action (it asks for no
text, or a url one already true on the task's own page) is refused when the task is read, with
an error naming the task and the assertion; a task holds at most MAX_CHECKS of them. Generated
with hypothesis: every assertion accepted fails on an empty page (by the comparison the runner
makes, Check.holds), every one refused passes it or asks for no text at all."""

from __future__ import annotations

import json
import posixpath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.remote.box.stages.webtasks import (
    CHECKS,
    MATCHES,
    MAX_CHECKS,
    MAX_TASK_LINE,
    TaskError,
    page_path,
    parse_task,
    read_tasks,
)

# Patterns that match every text, were they patterns: here they are literal text, which an
# empty page does not hold (there is no pattern kind).
MATCH_ALL = (".*", "^", "$", "(?:)", "a*", "[\\s\\S]*", "\\b", "x{0}", "|", ".?", "(.*)", "[^]*", "(?s).*")
WHITESPACE = " \t\n\r\x0b\x0c\xa0\u2003\u3000"
TEXTS = st.one_of(st.text(max_size=30), st.text(alphabet=WHITESPACE, max_size=6), st.sampled_from(MATCH_ALL),
                  st.builds(lambda pad, core: pad + core + pad, st.text(alphabet=WHITESPACE, max_size=3),
                            st.sampled_from(MATCH_ALL + ("", "red", "#pressed"))))
WHAT = {"text": "text of #result", "value": "value of #result", "attribute": "#result's aria-pressed",
        "url": "the URL"}
SEGMENTS = st.sampled_from(["pages", "a b", "t~1", "x%y", "é", "q?", "h#", ".", "sub"])
PAGES = st.builds(lambda parts, leaf: "/".join(parts + [leaf]), st.lists(SEGMENTS, max_size=3),
                  st.sampled_from(["t.html", "index.html", "p q.htm", "ü.html"]))


def a_task(checks: list, page: str = "pages/t.html", task_id: str = "t7") -> dict:
    return {"id": task_id, "page": page, "instruction": "press red", "elements": {"red": {"selector": "#red"}},
            "assert": checks}


def passes_on_an_empty_page(kind: str, match: str, written: str, start: str) -> bool:
    """The runner's comparison restated: the value read and the text asked for, each with its
    surrounding whitespace cut. An empty page reads nothing from its elements, and the task's own
    page's path as its URL."""
    value, wanted = (start if kind == "url" else ""), written.strip()
    return value == wanted if match == "equals" else wanted in value


@given(data=st.data(), kind=st.sampled_from(CHECKS), match=st.sampled_from(MATCHES), page=PAGES)
@settings(max_examples=600, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_an_assertion_is_refused_exactly_when_an_empty_page_passes_it(data, kind, match, page, tmp_path) -> None:
    start = page_path(posixpath.normpath(page))
    # Besides any text: pieces of the page's own path, which a url assertion reads before any action.
    written = data.draw(TEXTS | st.builds(lambda i, j: start[min(i, j):max(i, j)], st.integers(0, len(start)),
                                          st.integers(0, len(start))))
    spec = {"check": kind, match: written, "selector": "#result", "name": "aria-pressed"}
    try:
        task = parse_task(a_task([{"check": "text", "selector": "#r", "equals": "red"}, spec], page), str(tmp_path))
    except TaskError as e:
        # (A url assertion equal to no text never holds: refused as asking for nothing, all the same.)
        assert passes_on_an_empty_page(kind, match, written, start) or not written.strip(), str(e)
        assert str(e).startswith(f"task t7: assertion 2 ({WHAT[kind]} "), str(e)
        shown = json.dumps(written) if not written.strip() else json.dumps(written.strip())
        assert shown in str(e) or len(shown) > 100, str(e)  # longer ones are clipped
        return
    assert not passes_on_an_empty_page(kind, match, written, start)
    check = task.checks[1]
    assert not check.holds(None) and not check.holds("")  # the element empty, or not there at all
    assert kind != "url" or not check.holds(start)
    assert check.expected == written.strip()


@pytest.mark.parametrize("spec", [{"check": "url", "contains": ""}, {"check": "url", "contains": "  \t"},
                                  {"check": "text", "selector": "#r", "contains": ""},
                                  {"check": "value", "selector": "#n", "equals": " "},
                                  {"check": "attribute", "selector": "#red", "name": "hidden", "equals": ""},
                                  {"check": "url", "contains": "/pages/"}, {"check": "url", "contains": "html"},
                                  {"check": "url", "equals": "/pages/t.html"}])
def test_the_always_true_assertions_of_the_report_are_refused(spec, tmp_path) -> None:
    with pytest.raises(TaskError, match=r"^task t7: assertion 1 \(") as e:
        parse_task(a_task([spec]), str(tmp_path))
    assert "asks for no text" in str(e.value) or "before any action" in str(e.value)


def test_literal_patterns_and_a_url_after_the_action_are_kept(tmp_path) -> None:
    checks = [{"check": "text", "selector": "#r", "contains": pattern} for pattern in MATCH_ALL[:10]]
    checks += [{"check": "url", "contains": "#pressed-red"}, {"check": "url", "equals": "/pages/t.html#pressed-red"}]
    task = parse_task(a_task(checks[:MAX_CHECKS]), str(tmp_path))
    assert [c.expected for c in task.checks] == [c.get("contains") or c.get("equals") for c in checks[:MAX_CHECKS]]
    assert task.checks[0].holds(".*") and not task.checks[0].holds("anything at all")


@given(n=st.integers(1, 3 * MAX_CHECKS))
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_task_holds_at_most_max_checks_assertions(n, tmp_path) -> None:
    raw = a_task([{"check": "text", "selector": f"#r{i}", "equals": "red"} for i in range(n)])
    if n <= MAX_CHECKS:
        assert len(parse_task(raw, str(tmp_path)).checks) == n
        return
    with pytest.raises(TaskError) as e:
        parse_task(raw, str(tmp_path))
    assert str(e.value) == f"task t7: {n} assertions, over the {MAX_CHECKS} a task may have"


def test_a_line_full_of_assertions_is_refused_and_the_next_task_read(tmp_path) -> None:
    # The report's line: as many assertions as 64 KiB holds, each of which could wait for its element.
    many = [{"check": "url", "contains": "#x"}] * 1400
    lines = [json.dumps(a_task(many, task_id="full"), separators=(",", ":")),
             json.dumps(a_task(many[:2], task_id="fine"))]
    assert len(lines[0]) < MAX_TASK_LINE
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    refused, fine = list(read_tasks(str(path)))
    assert isinstance(refused, TaskError) and str(refused) == "task full: 1400 assertions, over the 16 a task may have"
    assert not isinstance(fine, TaskError) and fine.id == "fine" and len(fine.checks) == 2
