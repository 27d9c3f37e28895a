"""A headless Chromium driven over the DevTools protocol (CDP), for tests that look at pages.

Debian's ``chromium`` (``make test`` installs it when missing, like PostgreSQL's server
binaries), a fresh profile per browser, no network beyond what the page asks of loopback. Only
what the UI tests need: cookies, navigation, evaluating JavaScript (in the page or in one of
its same-origin iframes), waiting for a condition, full-page screenshots. The protocol goes
over ``websockets``' synchronous client; replies are matched by id and events are dropped.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1400,1000",
]


def find_chromium() -> str | None:
    """The Chromium binary: ``$RECS_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH."""
    override = os.environ.get("RECS_CHROMIUM")
    if override:
        return override
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One Chromium process and one page (tab) of it; use as a context manager."""

    def __init__(self, binary: str) -> None:
        from websockets.sync.client import connect

        self.profile = Path(tempfile.mkdtemp(prefix="recs-chromium-"))
        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            pages = [t for t in json.load(reply) if t.get("type") == "page"]
        self.socket = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Network.enable")

    def _devtools_port(self, timeout: float = 30.0) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            time.sleep(0.1)
        raise TimeoutError("chromium did not open its DevTools port")

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0):
        """Call one CDP method; its ``result`` (raises on a protocol error)."""
        message_id = next(self._ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def set_cookie(self, name: str, value: str, url: str) -> None:
        self.send("Network.setCookie", {"name": name, "value": value, "url": url})

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait until the document has loaded."""
        self.send("Page.navigate", {"url": url})
        time.sleep(0.2)
        self.wait_for("document.readyState === 'complete'", timeout=timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy; its value. TimeoutError names it. A DOM node
        comes back as ``{}`` (falsy here): test for one with ``!!(...)``."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            time.sleep(0.25)
        raise TimeoutError(f"not true after {timeout:.0f} s: {expression} (last: {value!r})")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page; ``full_page`` sizes the viewport to the whole document first."""
        if full_page:
            height = int(
                self.evaluate("Math.max(document.documentElement.scrollHeight, "
                              "document.body.scrollHeight)")
            )  # fmt: skip
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": 1400, "height": min(max(height, 800), 12000),
                       "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
            time.sleep(0.5)
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        self.send("Emulation.clearDeviceMetricsOverride")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
