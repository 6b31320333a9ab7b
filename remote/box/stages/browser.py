"""A headless Chromium driven by Playwright for web tasks: the pages served from loopback, each
episode in a fresh browser context, every other request refused, the browser always closed.

Playwright's request routing sees neither WebSockets nor what a worker or WebRTC opens, so the
network is closed below it too: Chromium sends everything but the page server to a proxy that
refuses (a loopback port held bound and never listening) and WebRTC's UDP nowhere; the page
server forbids workers of any kind (their realms are where Playwright's page scripts do not run);
each context blocks service workers and closes every WebSocket a page opens.

The browser is a system Chromium (chromium.py finds it), launched with executable_path. Pages
are untrusted: a page that hangs is that episode's timeout, a page that crashes its renderer
(its JS heap is capped) that episode's error, a browser that dies is started again for the next
episode; nothing a page does ends the run.

Runs ON the box, in the box venv (Playwright is in the box extra).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import socket
import threading
import time
import urllib.parse
from typing import Any, Iterator

from .webtasks import Action, Check, page_path, url_read

# A closed network: without these Chromium keeps trying Google's hosts at every start.
FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions")
CHECK_S = 1.0  # how long an assertion waits for its element
SETTLE_S = 2.0  # how long a performed action's page may take to load what it started


class _Pages(http.server.SimpleHTTPRequestHandler):
    """Files of one folder, never one outside it (a symlink out is a 404), no directory lists."""

    def translate_path(self, path: str) -> str:
        root = os.path.realpath(self.directory)
        wanted = urllib.parse.unquote(urllib.parse.urlsplit(path).path).lstrip("/")
        full = os.path.realpath(os.path.join(root, wanted))
        if os.path.commonpath([root, full]) == root and os.path.isfile(full):
            return full
        return os.path.join(root, ".no-such-page")  # the base class answers 404

    def end_headers(self) -> None:
        self.send_header("Content-Security-Policy", "worker-src 'none'")
        super().end_headers()

    def list_directory(self, path: Any) -> None:
        self.send_error(404)
        return None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


class PageServer:
    """The task folder served on a free loopback port for as long as the `with` lasts."""

    def __init__(self, folder: str) -> None:
        handler = functools.partial(_Pages, directory=os.path.realpath(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.origin = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def url(self, page: str) -> str:
        return self.origin + page_path(page)

    def __enter__(self) -> PageServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class EpisodeError(RuntimeError):
    """What kept one episode from running: its page, its renderer, the browser."""


class Browser:
    """One Chromium for a run; `page(url)` gives an episode its own context and closes it."""

    def __init__(self, executable: str, viewport: tuple[int, int], allowed_origin: str,
                 timeout_s: float = 10.0, js_heap_mb: int = 256) -> None:
        self.executable, self.viewport, self.allowed = executable, viewport, allowed_origin
        self.timeout_s = timeout_s  # an episode's limit; each page step is given at most this
        self.timeout_ms = int(timeout_s * 1000)
        self.args = list(FLAGS) + ["--js-flags=--max-old-space-size=%d" % js_heap_mb]
        self._playwright: Any = None
        self._browser: Any = None
        self._refuser: socket.socket | None = None

    def __enter__(self) -> Browser:
        from playwright.sync_api import sync_playwright

        self._refuser = socket.socket()
        self._refuser.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        try:
            self._playwright = sync_playwright().start()
            self._launch()
        except BaseException:
            self._close_refuser()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._browser is not None:
                self._browser.close()
        finally:
            self._browser = None
            self._playwright.stop()
            self._close_refuser()

    def _close_refuser(self) -> None:
        if self._refuser is not None:
            self._refuser.close()
            self._refuser = None

    def _launch(self) -> None:
        assert self._refuser is not None
        args = self.args + closed_network(self.allowed, self._refuser.getsockname()[1])
        self._browser = self._playwright.chromium.launch(executable_path=self.executable, args=args, timeout=30000)

    @property
    def version(self) -> str:
        return str(self._browser.version)

    def _context(self) -> Any:
        if self._browser is None or not self._browser.is_connected():  # it died in an earlier episode
            self._launch()
        return self._browser.new_context(viewport={"width": self.viewport[0], "height": self.viewport[1]},
                                         java_script_enabled=True, accept_downloads=False,
                                         service_workers="block")

    @contextlib.contextmanager
    def page(self, url: str) -> Iterator[Any]:
        """A fresh context's page loaded at url; closed whatever happens in it."""
        from playwright.sync_api import Error

        try:
            context = self._context()
        except Error as e:
            raise EpisodeError("the browser did not start: %s" % first_line(e)) from None
        crashed: list[bool] = []
        try:
            context.set_default_timeout(self.timeout_ms)
            context.route("**/*", self._only_our_pages)
            context.route_web_socket(lambda url: True, _refuse_web_socket)
            page = context.new_page()
            page.on("crash", lambda _page: crashed.append(True))
            try:
                page.goto(url, timeout=self.timeout_ms, wait_until="load")
                yield page
            except Error as e:
                raise EpisodeError(("the page crashed its renderer: %s" if crashed else "%s") % first_line(e)) from None
        finally:
            with contextlib.suppress(Error):
                context.close()

    def _only_our_pages(self, route: Any) -> None:
        url = route.request.url
        if url == self.allowed or url.startswith(self.allowed + "/"):
            route.continue_()
        else:
            route.abort("blockedbyclient")


def closed_network(origin: str, refuser_port: int) -> list[str]:
    """Chromium's flags for a network with the page server alone in it: every other connection,
    loopback included, through a proxy that refuses; WebRTC given no UDP but through that proxy."""
    return ["--proxy-server=http://127.0.0.1:%d" % refuser_port,
            "--proxy-bypass-list=<-loopback>;%s" % origin,  # <-loopback> first: loopback is proxied too
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"]


def _refuse_web_socket(ws: Any) -> None:
    ws.close(code=1008, reason="no WebSockets from a task page")


def ms(seconds: float) -> float:
    """A Playwright timeout: at least 1 ms, as 0 would be no limit at all."""
    return max(1.0, seconds * 1000)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def perform(page: Any, action: Action, settle_s: float = SETTLE_S) -> None:
    """Do what the model asked on the page, then give what it started a moment (settle_s) to load."""
    from playwright.sync_api import Error

    target = page.locator(action.selector).first
    try:
        if action.do == "click":
            target.click()
        elif action.do == "type":
            target.fill(action.text or "")
        else:
            target.select_option(action.text or "")
    except Error as e:
        raise EpisodeError("%s %s: %s" % (action.do, action.element, first_line(e))) from None
    with contextlib.suppress(Error):
        page.wait_for_load_state("load", timeout=ms(settle_s))


def check(page: Any, assertion: Check, origin: str, wait_s: float = CHECK_S) -> dict[str, Any]:
    """{"check", "passed", "actual", "wait_s"}: one DOM assertion read on the page as it is now, its
    element waited for at most wait_s (a url assertion reads the URL from origin's path on)."""
    from playwright.sync_api import Error

    row: dict[str, Any] = {"check": assertion.describe(), "passed": False, "actual": None,
                           "wait_s": round(wait_s, 3)}
    actual: str | None
    try:
        if assertion.check == "url":
            actual = url_read(page.url, origin)
        else:
            target = page.locator(assertion.selector).first
            if assertion.check == "text":
                actual = target.text_content(timeout=ms(wait_s))
            elif assertion.check == "value":
                actual = target.input_value(timeout=ms(wait_s))
            else:
                actual = target.get_attribute(assertion.attribute, timeout=ms(wait_s))
    except Error as e:
        return dict(row, error=first_line(e))
    return dict(row, passed=assertion.holds(actual), actual=None if actual is None else actual[:200])


def screenshot(page: Any, path: str) -> None:
    from playwright.sync_api import Error

    started = time.monotonic()
    try:
        page.screenshot(path=path, type="png")
    except Error as e:
        raise EpisodeError("no screenshot after %.1f s: %s" % (time.monotonic() - started, first_line(e))) from None
