"""The cu_eval stage: a served vision-language model operates web pages in headless Chromium, and
DOM assertions score each episode (playbook §10's computer-use evaluation).

Per episode: load the task's page (served from loopback by the stage), screenshot it, send the
screenshot (long side capped at --image-cap px) and the instruction to the model through the chat
API, read its answer as an action (webtasks.py), perform it with Playwright, check the task's
assertions. The reward is 1 when the answer was an action and every assertion passed, else 0.

Writes OUT/episodes.jsonl, one JSON object per episode: task, instruction, sample, sent and
original ([width, height]), answer (the model's raw text), action (an object, or null when the
answer is not an action), parse_error, answer_kind ("action", or for one that is no action of the
task "missed": in the action format, naming no element on the page, or "no_action": no action at
all; null when it was not asked: webtasks.py), error (null, or what kept the episode from running: the
page, the browser, the server), assertions ([{"check", "passed", "actual", "wait_s"}], wait_s the
most its element was waited for), reward, seconds,
url (where the page was at the end), shot (the screenshot, inside OUT);
OUT/summary.json (n, successes, success_rate, parse_failures, missed, errors, tasks, seconds, browser);
then prints CU_EVAL_RC=N (0: done; 1: success rate under --min-success; 2: errors, no browser,
no task file). Bounded: each episode by --episode-timeout (its request to the model, its action
and every assertion's wait together), the run by --run-timeout (the
episodes left are errors that say so); a page that hangs or crashes is its episode's error.

Runs ON the box, in the box venv:
  venv/bin/python -m samai_box.stages.cu_eval --url http://127.0.0.1:18081 \
      --tasks data/cu/tasks.jsonl --out runs/cu/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from .browser import CHECK_S, SETTLE_S, Browser, EpisodeError, PageServer, check, first_line, ms, perform, screenshot
from .chromium import BrowserMissing, find_browser
from .common import marker, say, write_json
from .eval import first_choice, pixels, unreachable
from .images import IMAGE_CAP, ImageError, chat_content
from .webtasks import Action, Task, TaskError, read_answer, read_tasks, summarize


@dataclass(frozen=True)
class Asking:
    """How the model is asked: where, how long it may answer, and how freely."""

    url: str
    max_tokens: int = 32
    temperature: float = 0.0
    timeout: float = 60.0
    image_cap: int = IMAGE_CAP

    def answer(self, content: list[dict[str, Any]], seed: int) -> str:
        request = {"messages": [{"role": "user", "content": content}], "max_tokens": self.max_tokens,
                   "temperature": self.temperature, "seed": seed}
        if self.temperature > 0:  # sampling to explore: the whole distribution, not llama.cpp's trimmed tail
            request.update(top_p=1.0, min_p=0.0, top_k=0)
        message = first_choice(self.url, "/v1/chat/completions", request, self.timeout).get("message") or {}
        thinking = message.get("reasoning_content") or message.get("reasoning") or ""
        return str(message.get("content") or "") + str(thinking)


class ServerDown(RuntimeError):
    """The model's server cannot be reached at all: every episode left would fail the same way."""


def episode(browser: Browser, server: PageServer, task: Task, asking: Asking, shots: str,
            sample: int) -> dict[str, Any]:
    """One episode's record: observe, ask, act, check; within the browser's episode limit, each
    step (the model's request, the action and its settling, each assertion's wait) given at most
    what is left of it."""
    started = time.monotonic()
    deadline = started + browser.timeout_s
    row = blank_row(sample, task)
    try:
        with browser.page(server.url(task.page)) as page:
            page.set_default_timeout(ms(left(deadline, browser)))  # the screenshot's wait: what the load left
            shot = os.path.join(shots, "%s-%d.png" % (safe_name(task.id), sample))
            screenshot(page, shot)
            row["shot"] = os.path.relpath(shot, os.path.dirname(shots))
            content, image = chat_content(shot, task.instruction, asking.image_cap)
            row["original"] = [image["width"], image["height"]]
            row["sent"] = [image["sent_width"], image["sent_height"]]
            action = answered(row, ask(replace(asking, timeout=min(asking.timeout, left(deadline, browser))),
                                       content, seed=sample), task)
            if action is not None:
                page.set_default_timeout(ms(left(deadline, browser)))
                perform(page, action, settle_s=min(SETTLE_S, left(deadline, browser)))
            for c in task.checks:  # kept as they are read: an episode past its limit says which were
                row["assertions"].append(check(page, c, server.origin, min(CHECK_S, left(deadline, browser))))
            row["url"] = page.url
    except (EpisodeError, ImageError) as e:
        row["error"] = str(e)
    row["reward"] = int(row["action"] is not None and row["error"] is None and bool(row["assertions"])
                        and all(a["passed"] for a in row["assertions"]))
    row["seconds"] = round(time.monotonic() - started, 3)
    return row


def answered(row: dict[str, Any], answer: str, task: Task) -> Action | None:
    """The model's answer into the episode's record (answer, action, parse_error, answer_kind);
    the action it asks for, None when it is no action of the task."""
    read = read_answer(answer, task)
    row.update(answer=answer, action=read.action.as_json() if read.action else None, parse_error=read.error,
               answer_kind=read.kind)
    return read.action


def left(deadline: float, browser: Browser) -> float:
    """Seconds left of the episode's limit; EpisodeError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise EpisodeError("the episode ran past its %g s limit (--episode-timeout)" % browser.timeout_s)
    return remaining


def ask(asking: Asking, content: list[dict[str, Any]], seed: int) -> str:
    try:
        return asking.answer(content, seed)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
        down = unreachable(e)
        if down is not None:
            raise ServerDown("cannot reach the model at %s: %s" % (asking.url, down)) from None
        raise EpisodeError("the model's server: %s" % (e,)) from None


def safe_name(task_id: str) -> str:
    """A task id as a file name: its letters and digits, the rest as _."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:80] or "task"


def run(tasks: Iterable[Task | TaskError], folder: str, out: str, asking: Asking, *, samples: int = 1,
        browser_path: str, viewport: tuple[int, int], episode_s: float, run_s: float,
        on_episode: Callable[[dict[str, Any]], None] = lambda row: None) -> tuple[list[dict[str, Any]], str]:
    """(every episode's record, the browser's version): each task `samples` times, in order."""
    shots = os.path.join(out, "shots")
    os.makedirs(shots, exist_ok=True)
    deadline = time.monotonic() + run_s
    rows: list[dict[str, Any]] = []
    with PageServer(folder) as server, Browser(browser_path, viewport, server.origin, episode_s) as browser:
        version, down = browser.version, None
        for task in tasks:
            for sample in range(samples):
                if isinstance(task, TaskError):
                    row = refused_row(str(task), sample)
                elif down or time.monotonic() > deadline:
                    row = refused_row(down or "not run: the run's %g s limit had passed" % run_s, sample, task)
                else:
                    try:
                        row = episode(browser, server, task, asking, shots, sample)
                    except ServerDown as e:
                        down = str(e)
                        row = refused_row(down, sample, task)
                rows.append(row)
                on_episode(row)
                if isinstance(task, TaskError):
                    break
    return rows, version


def blank_row(sample: int, task: Task | None = None, error: str | None = None) -> dict[str, Any]:
    """An episode's record before anything happened in it (with error: one that never ran)."""
    return {"task": task.id if task else None, "instruction": task.instruction if task else None,
            "split": task.split if task else None, "sample": sample, "sent": None, "original": None, "answer": None,
            "action": None, "parse_error": None, "answer_kind": None, "error": error, "assertions": [], "reward": 0,
            "url": None, "shot": None, "seconds": 0.0}


def refused_row(error: str, sample: int, task: Task | None = None) -> dict[str, Any]:
    return blank_row(sample, task, error)


def viewport_of(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError("WIDTHxHEIGHT, such as 224x224, not %r" % text) from None
    if not (16 <= width <= 4096 and 16 <= height <= 4096):
        raise argparse.ArgumentTypeError("each side between 16 and 4096 px, not %s" % text)
    return width, height


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the model's OpenAI-compatible server")
    p.add_argument("--tasks", required=True, help="the task file (JSONL), its pages beside it")
    p.add_argument("--out", required=True)
    p.add_argument("--split", choices=("all", "train", "heldout"), default="all")
    p.add_argument("--samples", type=int, default=1, help="episodes per task")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--image-cap", type=pixels, default=IMAGE_CAP, metavar="PX")
    p.add_argument("--viewport", type=viewport_of, default=(224, 224), metavar="WxH")
    p.add_argument("--browser", metavar="PATH", help="the Chromium to drive (default: the first found on PATH)")
    p.add_argument("--episode-timeout", type=float, default=20.0, metavar="S")
    p.add_argument("--run-timeout", type=float, default=1800.0, metavar="S")
    p.add_argument("--request-timeout", type=float, default=60.0, metavar="S")
    p.add_argument("--min-success", type=float, default=0.0)
    return p


def selected(tasks: Iterable[Task | TaskError], split: str) -> list[Task | TaskError]:
    return [t for t in tasks if split == "all" or isinstance(t, TaskError) or t.split == split]


def evaluate(args: argparse.Namespace, asking: Asking, out: str) -> dict[str, Any]:
    """Run the episodes into out and write episodes.jsonl and summary.json; the summary."""
    started = time.time()
    tasks = selected(read_tasks(args.tasks), args.split)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "episodes.jsonl"), "w") as f:
        def written(row: dict[str, Any]) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()
            say("episode %s/%d %s: %s" % (row["task"], row["sample"], "reward 1" if row["reward"] else "reward 0",
                                          row["error"] or row["parse_error"] or json.dumps(row["action"])))

        rows, version = run(tasks, os.path.dirname(os.path.abspath(args.tasks)), out, asking, samples=args.samples,
                            browser_path=args.browser_path, viewport=args.viewport, episode_s=args.episode_timeout,
                            run_s=args.run_timeout, on_episode=written)
    summary = dict(summarize(rows), seconds=round(time.time() - started, 1), browser=version, split=args.split,
                   samples=args.samples, temperature=asking.temperature, image_cap=asking.image_cap)
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


def main() -> None:
    args = parser().parse_args()
    try:
        args.browser_path = find_browser(args.browser)
    except BrowserMissing as e:
        marker("CU_EVAL_RC=2", str(e))
        sys.exit(2)
    if not os.path.isfile(args.tasks):
        marker("CU_EVAL_RC=2", "no task file at %s (fetch makes it)" % args.tasks)
        sys.exit(2)
    asking = Asking(args.url, args.max_tokens, args.temperature, args.request_timeout, args.image_cap)
    say("cu_eval: %s with %s, viewport %dx%d, screenshots capped at %d px" % (args.tasks, args.browser_path,
                                                                              args.viewport[0], args.viewport[1],
                                                                              args.image_cap))
    from playwright.sync_api import Error

    try:
        summary = evaluate(args, asking, args.out)
    except Error as e:  # the browser itself would not start: nothing was run
        marker("CU_EVAL_RC=2", "the browser %s did not start: %s" % (args.browser_path, first_line(e)))
        sys.exit(2)
    say(json.dumps(summary))
    rc = 2 if summary["errors"] else 1 if (summary["success_rate"] or 0) < args.min_success else 0
    marker("CU_EVAL_RC=%d" % rc, "success rate %s on %d episodes (%d parse failures, %d of them missed, %d errors)"
           % (summary["success_rate"], summary["n"], summary["parse_failures"], summary["missed"], summary["errors"]))
    sys.exit(rc)


if __name__ == "__main__":
    main()
