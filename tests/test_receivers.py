"""The loopback receivers take what the real apprise library sends: the watcher's tests stand on them."""

from __future__ import annotations

import apprise

from tests.receivers import PASSWORD, HttpReceiver, SmtpReceiver


def _send(url: str, title: str = "samai: stage train failed", body: str = "rc=137") -> bool:
    return bool(apprise.Apprise.instantiate(url).notify(body=body, title=title))


def test_the_json_webhook_gets_apprise_s_payload(json_receiver: HttpReceiver) -> None:
    assert _send(json_receiver.url)
    [got] = json_receiver.wait_for(1)
    assert (got.title, got.body, got.raw["type"]) == ("samai: stage train failed", "rc=137", "info")


def test_ntfy_gets_the_topic_and_the_login(ntfy_receiver: HttpReceiver) -> None:
    assert _send(ntfy_receiver.url)
    [got] = ntfy_receiver.wait_for(1)
    assert got.raw["topic"] == "samai-alerts" and got.title == "samai: stage train failed"
    assert got.headers["Authorization"].startswith("Basic ")


def test_email_arrives_over_smtp_after_a_login(smtp_receiver: SmtpReceiver) -> None:
    assert _send(smtp_receiver.url)
    [got] = smtp_receiver.wait_for(1)
    assert got.title == "samai: stage train failed" and "rc=137" in got.body
    assert smtp_receiver.logins == [(b"watch", PASSWORD.encode())]


def test_a_failing_receiver_is_a_failed_send_until_it_is_healthy(json_receiver: HttpReceiver) -> None:
    json_receiver.fail_next = 1
    assert not _send(json_receiver.url)
    assert _send(json_receiver.url) and len(json_receiver.wait_for(1)) == 1


async def test_box_text_in_an_email_stays_text_with_its_lines(smtp_receiver: SmtpReceiver) -> None:
    """The watcher's messages are plain text and say so to apprise: the email goes as text with its
    lines (or, where a service wants HTML, escaped), so a tag in a stage's output is shown, never
    rendered. (Handed to the plugin directly, it went as HTML: tags live, lines run together.)"""
    from samai.console.core.watch.policy import Message
    from samai.console.core.watch.sender import Sender, receivers

    body = "stage: train\n<b>boom</b> & <img src=x onerror=alert(1)>\nfix: press x"
    sender = Sender(receivers([smtp_receiver.url]), lambda line: None, retry_s=())
    await sender.send([Message("k", "alert", "error", "samai: <i>train</i> failed", body)], now=0.0)
    [got] = smtp_receiver.wait_for(1)
    html = got.raw.get_body(("html",))
    assert html is None or "<b>" not in html.get_content(), got.raw.as_string()
    text = got.raw.get_body(("plain",)).get_content()
    assert [line.strip() for line in text.strip().splitlines()] == body.splitlines(), text
    assert got.title == "samai: <i>train</i> failed"
