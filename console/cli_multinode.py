"""`fire STAGE` and `stop STAGE` of a multi-node stage on the command line: a connection to each
node's box, one confirmation (the command line's own, over every node's box and command), one
line of outcome and one per node."""

from __future__ import annotations

import sys
from collections.abc import Callable

from samai.console.core.actions import Confirm
from samai.console.core.audit import AuditLog
from samai.console.core.config import Config
from samai.console.core.multinode import MultiNodeError
from samai.console.core.multinode.actions import MultiOutcome
from samai.console.core.multinode.session import MultiNodeSession, multi_node_stage
from samai.console.core.paths import audit_log
from samai.console.core.redact import redact
from samai.console.core.secret_mask import SecretMask
from samai.remote.safe_text import visible

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


def is_multi_node(cfg: Config, stage_name: str) -> bool:
    return multi_node_stage(cfg, stage_name)


async def fire(cfg: Config, stage_name: str, *, readonly: bool, confirm: Confirm) -> int:
    return await _act(cfg, stage_name, readonly, confirm, lambda m: m.fire(stage_name))


async def stop(cfg: Config, stage_name: str, *, readonly: bool, confirm: Confirm, grace: float) -> int:
    return await _act(cfg, stage_name, readonly, confirm, lambda m: m.stop_all(stage_name, grace=grace))


async def _act(cfg: Config, stage_name: str, readonly: bool, confirm: Confirm, what) -> int:
    mask = SecretMask.of_config(cfg)  # its secrets by place too, in the audit log and what is said here
    session = MultiNodeSession(cfg, AuditLog(audit_log(), mask), readonly=readonly, confirm=confirm)
    try:
        outcome = await what(session.actions())
    except MultiNodeError as e:
        print(f"samai-console: {visible(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await session.close()
    return report(outcome, mask)


def report(outcome: MultiOutcome, mask: Callable[[str], str] = redact) -> int:
    stream = sys.stdout if outcome.ok else sys.stderr
    print(f"samai-console: {visible(mask(outcome.message))}", file=stream)
    for node, done in outcome.nodes:
        if not done.ok:
            for line in getattr(done.result, "stage_tail", ()):
                print(f"  | box {visible(node)}: {visible(mask(line))}", file=stream)
    return EXIT_OK if outcome.ok else EXIT_PROBLEM
