"""A GGUF smoke-tested by the pipeline's own server after surgery (§5: "health OK is not enough:
one answer, checked"): the serve stage's command pointed at the new file on a free port, ending
once its smoke answer is checked. It is fired through the action layer like any stage (planned,
confirmed, audited, refused read-only) and waited for; one that does not answer in time is stopped
through the action layer too, decided as part of the smoke the operator confirmed, and audited."""

from __future__ import annotations

import asyncio
import posixpath
import shlex
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from samai.console.core.actions import Actions, Decision
from samai.console.core.config import Config, Stage
from samai.console.core.roles import Role
from samai.remote.errors import BoxError
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.remote.boxapi import Box

SMOKE_STAGE = "gguf-smoke"
SMOKE_LOG = "logs/gguf-smoke.log"
SMOKE_DECISION = "smoke check"  # how the stop of an unanswered smoke stage is decided (and audited)
VERDICTS = ("SMOKE_OK", "SMOKE_FAIL", "SERVE_FAILED", "SERVE_REFUSED", "SERVER_DIED")
SHOWN_LOG = 1 << 20  # the log's last bytes kept with the result (its verdict is looked for in all of it)


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    said: str  # the stage's verdict line (SMOKE_OK ..., SMOKE_FAIL ...), or why there is none
    log: str  # its last lines (up to SHOWN_LOG bytes)


def smoke_config(cfg: Config, model: str) -> Config:
    """cfg with one more stage: its (first) serve-role stage's command on MODEL, port 0 (a free one), --smoke-only."""
    serve = cfg.stage_by_role(Role.SERVE)
    if serve is None:
        raise ValueError("the pipeline has no serve stage (role serve) to smoke-test the GGUF with")
    argv = shlex.split(serve.command)
    for flag, value in (("--model", model), ("--port", "0")):
        if flag not in argv or argv.index(flag) + 1 >= len(argv):
            raise ValueError(f"the serve stage's command has no {flag} to point at the new GGUF")
        argv[argv.index(flag) + 1] = value
    stage = Stage(SMOKE_STAGE, "", shlex.join([*argv, "--smoke-only"]), SMOKE_LOG,
                  description=f"smoke-test {model} with the pipeline's server", markers=serve.markers,
                  env=serve.env)
    return replace(cfg, stages=(*cfg.stages, stage))


async def smoke(actions: Actions, model: str, *, timeout: float = 600.0) -> SmokeResult:
    """Fire the smoke stage on MODEL and wait for its chain to end."""
    checked = Actions(actions.box, smoke_config(actions.config, model), actions.audit, readonly=actions.readonly,
                      confirm=actions.confirm)
    fired = await checked.fire(SMOKE_STAGE)
    if not fired.ok:
        return SmokeResult(False, fired.message, "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = (await actions.box.snapshot(processes=False)).state(SMOKE_STAGE)
        if rec is not None and rec.rc is not None and not rec.alive:
            break
        await asyncio.sleep(0.5)
    else:
        return SmokeResult(False, f"no answer within {timeout:.0f} s: {await _stop(checked)}", "")
    verdict, said, text = await read_verdict(actions.box, posixpath.join(actions.config.workspace, SMOKE_LOG))
    return SmokeResult(verdict is not None and verdict.startswith("SMOKE_OK"), said, text)


async def read_verdict(box: Box, path: str) -> tuple[str | None, str, str]:
    """The log's verdict: its last line that is one (None when it holds none, or could not be
    read whole), what to say of it, and the log's last lines (up to SHOWN_LOG bytes). The log is
    read whole, a read at a time, for the verdict is at its end however long the server's own
    lines before it run; one that cannot be read to its end gives no verdict, and says so."""
    from samai.console.core.checks import Unreadable, line_batches

    verdict: str | None = None
    shown: deque[str] = deque()
    held = 0
    try:
        async for batch in line_batches(box, path):
            for line in batch:
                if line.startswith(VERDICTS):
                    verdict = line
                shown.append(line)
                held += len(line) + 1
                while held > SHOWN_LOG and len(shown) > 1:
                    held -= len(shown.popleft()) + 1
    except (Unreadable, BoxError, TransportError) as e:
        last = f"; the last verdict read before that: {verdict}" if verdict else ""
        return None, f"no verdict: its log could not be read to its end ({e}){last}", "\n".join(shown)
    return verdict, verdict or "no verdict in its log", "\n".join(shown)


async def _stop(checked: Actions) -> str:
    """The unanswered smoke stage stopped: part of the smoke already confirmed, so not asked
    again, but planned, refused read-only and audited like any stop."""
    plan = checked.plan_stop(SMOKE_STAGE, grace=5)
    outcome = await checked.run(plan, Decision.confirmed(plan, SMOKE_DECISION))
    return "stopped" if outcome.ok else outcome.message
