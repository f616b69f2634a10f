"""Headless Chromium driven over the DevTools protocol, for dashboard tests.

Chromium's own ``--screenshot`` shoots before a Bokeh page has opened its websocket
and drawn, so the page is loaded in a real tab instead: JavaScript is evaluated in it
until the plots hold data, then the tab is captured. Debian's ``chromium`` package;
the websocket client is tornado's (a dependency of distributed).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

PACKAGE = "chromium"
INSTALL_ENV = "DFDL_INSTALL_TEST_DEPS"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--remote-debugging-port=0",
)


def missing() -> str | None:
    """Why Chromium cannot run here (None: it can), installing it first where allowed."""
    if shutil.which("chromium"):
        return None
    if os.environ.get(INSTALL_ENV) == "1" and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", PACKAGE]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            subprocess.run(install, env=env, capture_output=True)
    if shutil.which("chromium"):
        return None
    return (
        f"chromium not installed: apt-get install {PACKAGE}, or set {INSTALL_ENV}=1 "
        "(as .ci/run does) to let the test install it"
    )


class Chromium:
    """One headless Chromium with one tab; use as a context manager."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="dfdl-chromium-")
        self.proc = subprocess.Popen(
            ["chromium", *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.port = self._port()
        self.ids = itertools.count(1)
        self.loop = asyncio.new_event_loop()
        self.ws = self.loop.run_until_complete(self._connect())

    def _port(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                return int(m.group(1))
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    async def _connect(self):
        from tornado.websocket import websocket_connect

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list") as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        return await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=2**28)

    def call(self, method: str, **params):
        """Send one DevTools command and return its result."""

        async def go():
            n = next(self.ids)
            await self.ws.write_message(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                msg = json.loads(await self.ws.read_message())
                if msg.get("id") == n:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]

        return self.loop.run_until_complete(go())

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the tab."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        """Evaluate ``expression`` until it is truthy; returns that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.25)

    def screenshot(self, path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        with open(path, "wb") as f:
            f.write(png)
        return png

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        async def close():
            self.ws.close()

        try:
            # inside the tab's loop: tornado's write of the close frame makes a Future,
            # which outside a running loop needs a current one (asyncio.run() unsets it)
            self.loop.run_until_complete(close())
            self.loop.close()
        finally:  # chromium's helper processes share its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            shutil.rmtree(self.profile, ignore_errors=True)
