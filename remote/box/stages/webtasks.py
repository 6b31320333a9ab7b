"""Web tasks for a computer-use model: the task file, the model's answer read as an action, and
the episode record that `cu_eval` writes and `check eval` reads (playbook §10).

A task file is JSONL, one task per line, its pages in the same folder:
  {"id": "t1", "page": "pages/t1.html", "instruction": "press the button of this colour",
   "elements": {"red": {"selector": "#red"}, "name": {"selector": "#name", "action": "type"},
                "size": {"selector": "#size", "action": "select"}},
   "assert": [{"check": "text", "selector": "#result", "equals": "red"},
              {"check": "url", "contains": "#pressed"},
              {"check": "value", "selector": "#name", "equals": "ada"},
              {"check": "attribute", "selector": "#red", "name": "aria-pressed", "equals": "true"}],
   "split": "train" | "heldout"}
An element's action is "click" (the default), "type" or "select". An assertion's text is literal (there
is no pattern kind: a regex over untrusted page text has no time limit in the standard library), and is
compared with the value read with surrounding whitespace cut from both; a url assertion reads the URL
from the page server's path on ("/pages/t1.html#pressed"). An assertion that holds without the right
action proves nothing and is refused when the task is read: one that asks for no text (an empty
page passes it), and a url assertion that holds on the task's own page before any action. A task has at
most MAX_CHECKS assertions. The model's answer is read as
  click NAME | press the NAME button | NAME  (a click on the element called NAME)
  type NAME TEXT...                       (fill the field with TEXT)
  select NAME OPTION                      (choose OPTION of the list)
where NAME is one of the task's elements: the first word of the answer (thinking cut away) that
is a verb or a name decides. An answer that is none of these is a parse failure, of one of two
kinds (its `answer_kind`, beside "action" for one that is):
  missed     in the action format, but no action the page can take: a verb, or an answer of one
             word (the bare NAME form), that names no element on the page ("gren", "click yele":
             a misspelt or made-up name), or names one as it is not used. The model acts and
             misses: its low score is a real one.
  no_action  no action at all (no verb, no element's name, and more than one word; or nothing):
             the model does not speak the action format, the computer-use form of the fake 0 %.

Runs ON the box. Standard library only: everything here reads untrusted files and answers, and
raises TaskError (one task's error, never a traceback) for what it cannot use.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

from .images import inside

ACTIONS = ("click", "type", "select")
VERBS = {"click": "click", "press": "click", "tap": "click", "type": "type", "fill": "type", "select": "select",
         "choose": "select"}
FILLER = {"the", "a", "an", "on", "at", "in", "into", "button", "field", "list"}  # "press the red button"
CHECKS = ("text", "attribute", "value", "url")
MATCHES = ("equals", "contains")
MAX_TASK_LINE = 64 * 1024
MAX_TEXT = 1000  # a typed text, an expected value: what a task may ask for
MAX_CHECKS = 16  # what success looks like, in a few assertions: each may wait for its element
WORD = re.compile(r"[A-Za-z0-9_-]+")
# What an answer was (an episode's answer_kind): see the module's doc.
ACTION, MISSED, NO_ACTION = "action", "missed", "no_action"
ANSWER_KINDS = (ACTION, MISSED, NO_ACTION)


class TaskError(ValueError):
    """A task (or a task file) that cannot be run as written."""


@dataclass(frozen=True)
class Element:
    name: str
    selector: str
    action: str = "click"


@dataclass(frozen=True)
class Check:
    """One DOM assertion: what it reads (check, selector, attribute name) and what it wants."""

    check: str
    match: str
    expected: str
    selector: str | None = None
    attribute: str | None = None

    def holds(self, value: str | None) -> bool:
        """Whether the value read on the page (None: nothing to read) is what the assertion wants."""
        seen = (value or "").strip()
        return seen == self.expected if self.match == "equals" else self.expected in seen

    def describe(self) -> str:
        what = {"text": "text of %s", "value": "value of %s", "url": "the URL"}.get(self.check)
        if what is None:
            what = "%s's %s" % (self.selector, self.attribute)
        elif "%s" in what:
            what = what % self.selector
        return "%s %s %s" % (what, self.match, json.dumps(self.expected))


@dataclass(frozen=True)
class Task:
    id: str
    page: str  # the page's path inside the task folder
    instruction: str
    elements: tuple[Element, ...]
    checks: tuple[Check, ...]
    split: str = "train"

    def element(self, name: str) -> Element | None:
        return next((e for e in self.elements if e.name == name), None)


@dataclass(frozen=True)
class Action:
    do: str  # click | type | select
    element: str
    selector: str
    text: str | None = None  # what is typed, or the option selected

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"do": self.do, "element": self.element, "selector": self.selector}
        if self.text is not None:
            out["text"] = self.text
        return out


def page_path(page: str) -> str:
    """The path the page server serves a task's page at: what a url assertion reads on that page
    before any action."""
    return "/" + urllib.parse.quote(page)


def url_read(url: str, origin: str) -> str:
    """What a url assertion reads: the page's URL from the page server's path on (its origin is a
    port chosen at each run); a URL elsewhere (an error page) whole."""
    return url[len(origin):] if url.startswith(origin + "/") else url


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or "\0" in value:
        raise TaskError("%s must be a text of 1 to %d characters, not %s" % (what, limit, _shown(value)))
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def parse_task(raw: Any, folder: str) -> Task:
    """A task from one decoded line of a task file, its page checked to lie inside folder."""
    if not isinstance(raw, Mapping):
        raise TaskError("a task is a JSON object, not %s" % _shown(raw))
    task_id = raw.get("id")
    if isinstance(task_id, bool) or not isinstance(task_id, (str, int)):
        raise TaskError("a task needs an id (a text or a number), not %s" % _shown(task_id))
    task_id = _text(str(task_id), "id", 200)
    # Lexically normalized as the browser's URL is: the path a url assertion reads is the one sent.
    page = posixpath.normpath(_text(raw.get("page"), "task %s: page" % task_id, 1000))
    try:
        inside(folder, page)
    except ValueError as e:
        raise TaskError("task %s: %s" % (task_id, e)) from None
    elements = raw.get("elements")
    if not isinstance(elements, Mapping) or not elements:
        raise TaskError("task %s: elements must be an object of named elements" % task_id)
    checks = raw.get("assert")
    if not isinstance(checks, list) or not checks:
        raise TaskError("task %s: assert must be a list of one or more DOM assertions" % task_id)
    if len(checks) > MAX_CHECKS:
        raise TaskError("task %s: %d assertions, over the %d a task may have" % (task_id, len(checks), MAX_CHECKS))
    split = raw.get("split", "train")
    if split not in ("train", "heldout"):
        raise TaskError("task %s: split is train or heldout, not %s" % (task_id, _shown(split)))
    return Task(id=task_id, page=page, instruction=_text(raw.get("instruction"), "task %s: instruction" % task_id),
                elements=tuple(_element(task_id, name, spec) for name, spec in elements.items()),
                checks=tuple(_check(task_id, n, c, page_path(page)) for n, c in enumerate(checks, 1)),
                split=split)


def _element(task_id: str, name: Any, spec: Any) -> Element:
    if not isinstance(name, str) or not WORD.fullmatch(name) or len(name) > 60:
        raise TaskError("task %s: an element's name is one word, not %s" % (task_id, _shown(name)))
    if not isinstance(spec, Mapping):
        raise TaskError("task %s: element %s must be an object with a selector" % (task_id, name))
    action = spec.get("action", "click")
    if action not in ACTIONS:
        raise TaskError("task %s: element %s: action is one of %s, not %s" % (task_id, name, ", ".join(ACTIONS),
                                                                            _shown(action)))
    return Element(name.lower(), _text(spec.get("selector"), "task %s: element %s: selector" % (task_id, name)), action)


def _check(task_id: str, number: int, raw: Any, start: str) -> Check:
    if not isinstance(raw, Mapping) or raw.get("check") not in CHECKS:
        raise TaskError("task %s: an assertion is an object whose check is one of %s" % (task_id, ", ".join(CHECKS)))
    kind = raw["check"]
    found = [m for m in MATCHES if m in raw]
    if len(found) != 1:
        raise TaskError("task %s: a %s assertion says exactly one of %s" % (task_id, kind, ", ".join(MATCHES)))
    expected = raw[found[0]]
    if not isinstance(expected, str) or len(expected) > MAX_TEXT:
        raise TaskError("task %s: a %s assertion's %s is a text of at most %d characters"
                        % (task_id, kind, found[0], MAX_TEXT))
    selector = attribute = None
    if kind != "url":
        selector = _text(raw.get("selector"), "task %s: a %s assertion's selector" % (task_id, kind))
    if kind == "attribute":
        attribute = _text(raw.get("name"), "task %s: an attribute assertion's name" % task_id, 200)
    check = Check(kind, found[0], expected.strip(), selector, attribute)
    # Any action earns the reward of an assertion that holds without it.
    if not check.expected:  # an empty page passes it (a URL is never empty: there it never holds)
        raise TaskError("task %s: assertion %d (%s) asks for no text: it must name what the right action makes true"
                        % (task_id, number, _clipped(replace(check, expected=expected).describe())))
    if kind == "url" and check.holds(start):
        raise TaskError("task %s: assertion %d (%s) holds on the task's own page (%s) before any action"
                        % (task_id, number, _clipped(check.describe()), _clipped(start)))
    return check


def _clipped(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_tasks(path: str) -> Iterator[Task | TaskError]:
    """Each line of a task file as a Task, or the TaskError that says why it cannot be run."""
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if len(line) > MAX_TASK_LINE:
                yield TaskError("line %d: %d bytes, over the %d KiB a task may take"
                                % (number, len(line), MAX_TASK_LINE // 1024))
                continue
            try:
                yield parse_task(json.loads(line), folder)
            except (ValueError, RecursionError) as e:
                yield e if isinstance(e, TaskError) else TaskError("line %d: not JSON (%s)" % (number, e))


def answer_text(content: str) -> str:
    """What the model answered once any thinking is cut away."""
    if "</think>" in content:
        return content.rsplit("</think>", 1)[-1]
    return content.split("<think>", 1)[0]


@dataclass(frozen=True)
class Answer:
    """The model's answer as read: the action it asks for, or why it is none; and its kind
    (ACTION, MISSED or NO_ACTION: see the module's doc)."""

    action: Action | None
    error: str | None
    kind: str


def parse_action(answer: str, task: Task) -> tuple[Action | None, str | None]:
    """(the action the answer asks for, None) or (None, why it is not one of the task's actions)."""
    read = read_answer(answer, task)
    return read.action, read.error


def read_answer(answer: str, task: Task) -> Answer:
    """The answer read as one of the task's actions, or why not and which kind of miss it is."""
    words = WORD.findall(answer_text(answer)[:4000])
    for i, word in enumerate(words):
        lowered = word.lower()
        if lowered in VERBS:
            action, error = _verb_action(VERBS[lowered], words[i + 1:], task)
        elif task.element(lowered) is not None:
            action, error = _verb_action("click", words[i:], task)
        else:
            continue
        return Answer(action, error, ACTION if action is not None else MISSED)
    names = ", ".join(e.name for e in task.elements)
    if len(words) == 1:  # the bare NAME form, of a name the page does not have
        return Answer(None, "%s: no such element (names: %s)" % (json.dumps(words[0][:60]), names), MISSED)
    shown = answer.strip()[:80]
    return Answer(None, "no action in the answer %s (names: %s)" % (json.dumps(shown), names), NO_ACTION)


def answer_kind(answer: object) -> str:
    """The kind of an answer that was no action of its task, told without the task (an episode
    recorded before episodes said their answer_kind): MISSED when it takes the action format (a
    verb among its words, or one word alone), else NO_ACTION."""
    words = WORD.findall(answer_text(answer)[:4000]) if isinstance(answer, str) else []
    return MISSED if len(words) == 1 or any(w.lower() in VERBS for w in words) else NO_ACTION


def _verb_action(do: str, rest: list[str], task: Task) -> tuple[Action | None, str | None]:
    while rest and rest[0].lower() in FILLER and task.element(rest[0].lower()) is None:
        rest = rest[1:]
    if not rest:
        return None, "%s of nothing" % do
    element = task.element(rest[0].lower())
    if element is None:
        return None, "%s %s: no such element (names: %s)" % (do, json.dumps(rest[0][:60]),
                                                              ", ".join(e.name for e in task.elements))
    if element.action != do:
        return None, "%s %s: that element takes %s" % (do, element.name, element.action)
    if do == "click":
        return Action("click", element.name, element.selector), None
    if len(rest) < 2:
        return None, "%s %s: with what?" % (do, element.name)
    text = " ".join(rest[1:]) if do == "type" else rest[1]
    return Action(do, element.name, element.selector, text[:MAX_TEXT]), None


def summarize(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A cu run's summary: its success rate and what kept the rest from succeeding (parse_failures:
    the answers that were no action of the task, `missed` of them in the action format)."""
    n = len(episodes)
    successes = sum(1 for e in episodes if e.get("reward") == 1)
    failed = [e for e in episodes if e.get("action") is None and e.get("error") is None]
    return {"n": n, "successes": successes, "success_rate": round(successes / n, 4) if n else None,
            "parse_failures": len(failed), "missed": sum(1 for e in failed if e.get("answer_kind") == MISSED),
            "errors": sum(1 for e in episodes if e.get("error") is not None),
            "tasks": len({e.get("task") for e in episodes})}
