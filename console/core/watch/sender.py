"""Sending through apprise: one receiver per URL, each retried on its own with backoff.

The URLs may hold secrets (a password, a webhook token): nothing here prints, logs or returns
one. A receiver is named by its service and number ("ntfy #1"); apprise's own log records
pass through the config's SecretMask (console/core/secret_mask.py) before the watcher's log sees them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from samai.console.core.redact import redact
from samai.console.core.secret_mask import SecretMask
from samai.console.core.watch.policy import Message

RETRY_S = (5.0, 15.0, 60.0, 300.0, 900.0)  # the pause before each retry of one message to one receiver
SEND_DEADLINE_S = 60.0  # one send may not hold the watcher longer (apprise's own timeouts are shorter)
MAX_PENDING = 200  # messages waiting for a retry, over all receivers: the oldest give way
NOTIFY_TYPE = {"info": "info", "warning": "warning", "error": "failure"}


class NotifyConfigError(ValueError):
    """A notification URL apprise cannot use: said by its number and scheme, never its text."""


@dataclass
class Receiver:
    name: str  # "ntfy #1": what the watcher's log and status call it
    sends: Any  # an apprise.Apprise holding this URL's service alone


# Told of each delivery: the message, the receiver's name, when (the watcher keeps what it sent).
Told = Callable[[Message, str, float], None]


@dataclass
class Pending:
    message: Message
    receiver: Receiver
    attempts: int
    due: float
    told: Told | None = None


def receivers(urls: Sequence[str]) -> list[Receiver]:
    import apprise  # the watcher's alone: the TUI never imports it

    out = []
    for i, url in enumerate(urls, 1):
        plugin = apprise.Apprise.instantiate(url)
        if plugin is None:
            scheme = url.split("://", 1)[0][:20] if "://" in url else "?"
            raise NotifyConfigError(f"notification URL #{i} ({scheme}://…) is not one apprise can send to")
        # Through an Apprise object, not the plugin: it turns our plain text into the service's
        # format (for email, escaped HTML with its line breaks), so box text is never markup there.
        sends = apprise.Apprise()
        sends.add(plugin)
        out.append(Receiver(f"{plugin.service_name} #{i}", sends))
    return out


@dataclass
class Sender:
    receivers: list[Receiver]
    say: Callable[[str], None]  # the watcher's log line
    pending: list[Pending] = field(default_factory=list)
    sent: int = 0
    unsent: int = 0  # dropped after their last retry, or pushed out by newer ones
    last_sent: float | None = None
    last_error: str = ""
    retry_s: tuple[float, ...] = RETRY_S
    # What leaves for a receiver: box text may quote a secret the config keeps (a stage that prints its token).
    mask: Callable[[str], str] = redact

    async def send(self, messages: Sequence[Message], now: float, told: Told | None = None) -> None:
        """Each message to every receiver now; a receiver that fails gets it again later (retry).
        told: called for each delivery, now or at a retry."""
        for m in messages:
            for r in self.receivers:
                await self._attempt(Pending(m, r, 0, now, told), now)

    async def retry(self, now: float) -> None:
        """The messages whose retry is due, oldest first."""
        due, self.pending = [p for p in self.pending if p.due <= now], [p for p in self.pending if p.due > now]
        for p in due:
            await self._attempt(p, now)

    async def _attempt(self, p: Pending, now: float) -> None:
        ok = await self._deliver(p.message, p.receiver)
        if ok:
            self.sent += 1
            self.last_sent = now
            self.say(f"sent {p.message.kind} to {p.receiver.name}: {p.message.title}")
            if p.told is not None:
                p.told(p.message, p.receiver.name, now)
            return
        if p.attempts >= len(self.retry_s):
            self.unsent += 1
            self.last_error = f"{p.receiver.name}: not sent after {p.attempts + 1} tries: {p.message.title}"
            self.say(self.last_error)
            return
        pause = self.retry_s[p.attempts]
        self.last_error = f"{p.receiver.name} did not take {p.message.kind} message; retry in {pause:.0f} s"
        self.say(self.last_error)
        self.pending.append(Pending(p.message, p.receiver, p.attempts + 1, now + pause, p.told))
        if len(self.pending) > MAX_PENDING:
            self.pending.pop(0)
            self.unsent += 1

    async def _deliver(self, m: Message, r: Receiver) -> bool:
        try:
            return bool(await asyncio.wait_for(asyncio.to_thread(
                r.sends.notify, body=self.mask(m.body), title=self.mask(m.title),
                notify_type=NOTIFY_TYPE.get(m.severity, "info"), body_format="text"),
                SEND_DEADLINE_S))
        except Exception as e:  # a plugin's bug or a deadline is a failed send, never the watcher's end
            self.say(f"{r.name}: {type(e).__name__}")
            return False


class MaskedHandler(logging.Handler):
    """apprise's log records, masked, as the watcher's log lines (it logs a failed send's reason)."""

    def __init__(self, mask: SecretMask, say: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.mask, self.say = mask, say

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.say("apprise: " + self.mask(record.getMessage()))
        except Exception:  # a log line must never end the watcher
            pass


def route_apprise_log(mask: SecretMask, say: Callable[[str], None]) -> None:
    log = logging.getLogger("apprise")
    log.handlers = [MaskedHandler(mask, say)]
    log.propagate = False  # never to a root handler that would print it unmasked
    log.setLevel(logging.WARNING)
