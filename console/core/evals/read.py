"""Read an eval file by its shape: our items.jsonl, or an OpenAI/llama.cpp chat-completion server's own
responses (one JSON object, a JSON array of them, or one per line), each with an optional `gold`
and an optional `prompt`/`messages` request beside it (top level, or as {"request", "response", "gold"}).

Every record comes out as an EvalRecord, the same figures whatever the format; a record that is
neither kind, or not of the kind the file started with, comes out as a Malformed with its number.
Everything here is untrusted input: nothing raises on garbage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

ITEMS, CHAT = "items", "chat-completion"  # the formats
JSONL, JSON_ONE, JSON_ARRAY = "jsonl", "json", "json-array"  # how the records are laid out
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RESPONSE_OBJECTS = ("chat.completion", "chat.completion.chunk")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

EXPECTED = {ITEMS: "eval items (a JSON object with id, pred and gold or correct)",
            CHAT: "chat-completion responses (a JSON object with choices[0].message)"}
EXPECTED_ANY = (f"{EXPECTED[ITEMS]} or {EXPECTED[CHAT]}, one per line, one JSON object or a JSON array; "
                "optionally with gold and the prompt/messages asked")


@dataclass(slots=True)  # not frozen: built once per record, and a frozen __init__ costs a third of the check
class EvalRecord:
    """One answer, read: what check_eval counts, whatever the file's format."""

    kind: str
    correct: bool | None  # None: no gold and no `correct` to score it against
    no_pred: bool
    finish_reason: Any
    content_empty: bool
    has_reasoning: bool
    think_leak: bool
    gold_in_reasoning: bool  # for an item with no answer: its gold is in reasoning_content, where a join finds it
    image_sent: tuple[int, int] | None = None  # (width, height) of the image the item sent, when it says


@dataclass(frozen=True, slots=True)
class Malformed:
    """A record that cannot be read as the file's kind: its 1-based line (or array element) number."""

    number: int


class EvalReader:
    """The records of an eval file, with the layout and kind found once they are read."""

    def __init__(self) -> None:
        self.layout = JSONL
        self.kind: str | None = None  # the first readable record's; later records must match it

    def read(self, lines: Iterable[str]) -> Iterator[EvalRecord | Malformed]:
        for number, value in self._values(lines):
            record = _record(value, self.kind)
            if record is None:
                yield Malformed(number)
                continue
            self.kind = record.kind
            yield record

    # --- layout -------------------------------------------------------------------------

    def _values(self, lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
        """(number, parsed JSON or BAD) per record: per line, unless the whole file is one JSON document."""
        rest = iter(lines)
        head = _through_first_text(rest)
        if not head:
            return
        first = _loads(head[-1])
        if first is BAD and head[-1].lstrip()[:1] in "{[":  # perhaps one JSON value written over many lines
            tail = list(rest)
            document = _loads("\n".join(head + tail))
            if isinstance(document, (dict, list)):
                yield from self._document(document)
            else:
                yield from _numbered(head + tail)
            return
        if isinstance(first, list):  # one line holding an array: the file's, when no other line follows
            following = _through_first_text(rest)
            if not following:
                yield from self._document(first)
                return
            head += following
        yield from _numbered(head, rest)

    def _document(self, document: dict | list) -> Iterator[tuple[int, Any]]:
        if isinstance(document, dict):
            self.layout = JSON_ONE
            yield 1, document
            return
        self.layout = JSON_ARRAY
        yield from enumerate(document, 1)


class _Bad:
    """The stand-in for a line that is not JSON."""


BAD = _Bad()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the decoder's stack
        return BAD


def _through_first_text(lines: Iterator[str]) -> list[str]:
    """The lines up to and with the first one that is not blank; [] when there is none."""
    taken = []
    for line in lines:
        taken.append(line)
        if line.strip():
            return taken
    return []


def _numbered(head: list[str], rest: Iterable[str] = ()) -> Iterator[tuple[int, Any]]:
    """JSONL: each non-blank line parsed, with its 1-based number (a blank line is no record)."""
    number = 0
    for lines in (head, rest):
        for line in lines:
            number += 1
            if line.strip():
                yield number, _loads(line)


# --- records ---------------------------------------------------------------------------


def _record(value: Any, kind: str | None) -> EvalRecord | None:
    if not isinstance(value, dict):
        return None
    response = _response_of(value)
    if response is not None:
        return _from_response(value, response) if kind in (None, CHAT) else None
    if _looks_like_response(value):
        return None  # response-shaped but without choices[0].message: never one of our items
    return _from_item(value) if kind in (None, ITEMS) else None


def _looks_like_response(value: dict) -> bool:
    """A chat-completion's marks: its choices, its object type or its id (chatcmpl-...)."""
    ident = value.get("id")
    return ("choices" in value or value.get("object") in RESPONSE_OBJECTS
            or (isinstance(ident, str) and ident.startswith("chatcmpl-")))


def _response_of(value: dict) -> dict | None:
    """The response in value: itself, or its "response" (a recorded request/response pair)."""
    for candidate in (value, value.get("response")):
        if isinstance(candidate, dict) and _message(candidate) is not None:
            return candidate
    return None


def _message(response: dict) -> dict | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _text(value: object) -> str:
    if isinstance(value, str):  # the common case first: this runs several times per record
        return value
    if value is None:
        return ""
    try:
        return str(value)
    except RecursionError:  # a list nested almost as deep as the decoder allows: no answer text
        return ""


def _content_text(value: object) -> str:
    """A message's content: a string, or OpenAI's list of parts ({"type": "text", "text": ...})."""
    if isinstance(value, list):
        return "".join(part["text"] for part in value if isinstance(part, dict) and isinstance(part.get("text"), str))
    return _text(value)


def _answer(content: str) -> str:
    """What follows the thinking: after the last </think>, or before an unclosed <think>."""
    if THINK_CLOSE in content:
        return content.rsplit(THINK_CLOSE, 1)[-1].strip()
    return content.split(THINK_OPEN, 1)[0].strip()


def matches(answer: str, gold: object) -> bool:
    """The answer is the gold: the same stripped text, or (as the eval stage scores) its last number."""
    want, got = _text(gold).strip(), answer.strip()
    if not got or not want:
        return False
    if got == want:
        return True
    numbers = NUMBER.findall(got)
    return bool(numbers) and NUMBER.fullmatch(want) is not None and numbers[-1] == want


def _contains(text: str, gold: object) -> bool:
    want = _text(gold).strip()
    if not want or not text:
        return False
    if NUMBER.fullmatch(want):
        return want in NUMBER.findall(text)
    return want in text


def _from_response(outer: dict, response: dict) -> EvalRecord:
    message = _message(response) or {}
    content = _content_text(message.get("content"))
    reasoning = _text(message.get("reasoning_content") or message.get("reasoning"))
    gold = outer.get("gold", response.get("gold"))
    answer = _text(outer["pred"]) if "pred" in outer else _answer(content)  # a pred added by hand wins
    if isinstance(outer.get("correct"), bool):
        correct: bool | None = outer["correct"]
    else:
        correct = matches(answer, gold) if gold is not None else None
    choice, no_pred = response["choices"][0], not answer.strip()
    return EvalRecord(kind=CHAT, correct=correct, no_pred=no_pred,
                      finish_reason=choice.get("finish_reason"), content_empty=not content.strip(),
                      has_reasoning=bool(reasoning.strip()), think_leak=_leaks(content),
                      gold_in_reasoning=no_pred and _contains(reasoning, gold))


def _from_item(item: dict) -> EvalRecord | None:
    """One line of our items.jsonl (id, pred, gold or correct), as the eval stage writes it."""
    if "id" not in item or "pred" not in item:
        return None
    written = item.get("correct")
    if not isinstance(written, bool) and "gold" not in item:
        return None  # nothing to score it against
    pred = _text(item["pred"]).strip()
    if not isinstance(written, bool):
        written = bool(pred) and pred == _text(item.get("gold")).strip()
    content, reasoning = _text(item.get("content")), _text(item.get("reasoning_content"))
    return EvalRecord(kind=ITEMS, correct=written, no_pred=not pred, finish_reason=item.get("finish_reason"),
                      content_empty=not content.strip(), has_reasoning=bool(reasoning.strip()),
                      think_leak=_leaks(content), gold_in_reasoning=not pred and _contains(reasoning, item.get("gold")),
                      image_sent=_sent_size(item.get("image")))


def _sent_size(image: object) -> tuple[int, int] | None:
    """The size of the image an item sent: its sent_width x sent_height, or its own size when it was
    sent as it is (resized false); None when the record does not say (or says garbage)."""
    if not isinstance(image, dict):
        return None
    sent = _size(image.get("sent_width"), image.get("sent_height"))
    if sent is None and image.get("resized") is False:
        return _size(image.get("width"), image.get("height"))
    return sent


def _size(width: object, height: object) -> tuple[int, int] | None:
    if isinstance(width, int) and isinstance(height, int) and not isinstance(width, bool) \
            and not isinstance(height, bool) and width > 0 and height > 0:
        return width, height
    return None


def _leaks(content: str) -> bool:
    """Thinking in content with no answer after it: an unclosed <think>, or nothing after </think>.
    A closed thinking followed by the answer is what --reasoning-format none sends (the §6 fix)."""
    return (THINK_OPEN in content or THINK_CLOSE in content) and not _answer(content)
