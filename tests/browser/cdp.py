"""A small Chrome DevTools Protocol client: headless Chromium driven over one page websocket.

Uses ``websockets`` (a dependency of Streamlit, so always installed with it). Chromium is started
with ``--remote-debugging-port=0``; the port it picked is read from ``DevToolsActivePort`` in the
fresh user-data dir.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from websockets.sync.client import connect

# STACK.md: flags that keep Chromium off the network and work as root in a container.
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
)


def find_chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium with one page; ``call`` sends a CDP command and waits for its reply."""

    def __init__(self, binary: str, width: int = 1440, height: int = 1000, timeout_s: float = 60.0) -> None:
        self.profile = tempfile.mkdtemp(prefix="ulorl-chromium-")
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.port = self._wait_port(timeout_s)
        page_ws = self._page_ws(timeout_s)
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(page_ws, max_size=None, open_timeout=timeout_s))
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _wait_port(self, timeout_s: float) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode} before DevTools was up")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines:
                    return int(lines[0])
            time.sleep(0.1)
        raise TimeoutError(f"chromium wrote no {marker} within {timeout_s} s")

    def _page_ws(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                conn.request("GET", "/json/list")
                targets = json.loads(conn.getresponse().read())
            except (OSError, ValueError):
                targets = []
            finally:
                conn.close()
            pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.2)
        raise TimeoutError("chromium exposed no page target")

    def call(self, method: str, params: Optional[dict[str, Any]] = None, timeout_s: float = 30.0) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no CDP reply to {method} within {timeout_s} s")
            msg = json.loads(self.ws.recv(timeout=left))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method} failed: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error in {expression!r}: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def wait_for(self, expression: str, timeout_s: float = 60.0, interval_s: float = 0.25) -> Any:
        """Poll a JS expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except RuntimeError:
                last = None
            if last:
                return last
            time.sleep(interval_s)
        raise TimeoutError(f"timed out after {timeout_s} s waiting for: {expression} (last value {last!r})")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            # Streamlit scrolls inside its main container: measure it and grow the viewport to fit.
            height = self.evaluate(
                "Math.max(document.body.scrollHeight, ...Array.from(document.querySelectorAll("
                "'[data-testid=\"stMain\"], [data-testid=\"stAppViewContainer\"], section.main'))"
                ".map(e => e.scrollHeight))") or 1000
            width = self.evaluate("document.documentElement.clientWidth") or 1440
            height = int(min(max(height, 600), 6000))
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": int(width), "height": height, "deviceScaleFactor": 1, "mobile": False})
            time.sleep(0.8)  # let charts re-layout to the new viewport
        data = self.call("Page.captureScreenshot", params, timeout_s=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def reset_viewport(self, width: int = 1440, height: int = 1000) -> None:
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def close(self) -> None:
        try:
            self._stack.close()
        except Exception:  # the socket may already be gone with the browser
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
