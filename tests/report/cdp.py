"""Render an HTML file in headless Chromium and read back what a reader sees (Chrome DevTools protocol).

Chromium runs with a fresh profile and every background service off (no network is reachable
here); the page is opened over ``file://``. While it loads, console errors, uncaught exceptions
and every network request other than ``file:``/``data:`` are recorded; then a script measures
images and table widths, and a full-page screenshot is taken.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars")

_MEASURE = r"""
(() => {
  const imgs = [...document.images];
  const tables = [...document.querySelectorAll('table')].map(t => {
    const box = t.parentElement;
    return {caption: (t.caption ? t.caption.innerText : ''), width: t.scrollWidth,
            room: box.clientWidth, fits: t.scrollWidth <= box.clientWidth + 1};
  });
  return {
    text: document.body.innerText,
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    images: imgs.length, imagesLoaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    tables: tables, height: document.documentElement.scrollHeight,
  };
})()
"""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable, or None."""
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        path = name if Path(name).is_file() else shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Rendered:
    """What the browser saw."""

    text: str
    page_width: int
    view_width: int
    images: int
    images_loaded: int
    tables: list[dict[str, Any]]
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""


class _Page:
    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client (test extra)

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < end:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return
        raise TimeoutError(f"no {method} within {timeout} s")


def render(html_path: Path, *, width: int = 1400, height: int = 900, exe: str | None = None) -> Rendered:
    """Open ``html_path`` in headless Chromium at ``width`` x ``height`` and measure it.

    Raises:
        RuntimeError: Chromium did not start or the protocol failed.
    """
    exe = exe or find_chromium()
    if exe is None:
        raise RuntimeError("no Chromium found")
    profile = tempfile.mkdtemp(prefix="datarecon-chromium-")
    proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        end = time.monotonic() + 60
        seen = []
        while port is None and time.monotonic() < end:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            raise RuntimeError("Chromium did not open its DevTools port:\n" + "".join(seen[-20:]))
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page_target = next(t for t in targets if t.get("type") == "page")
        page = _Page(page_target["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        page.events.clear()
        page.call("Page.navigate", url=html_path.resolve().as_uri())
        page.wait_for("Page.loadEventFired")
        measured = page.call("Runtime.evaluate", expression=_MEASURE, returnByValue=True)["result"]["value"]
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        errors, requests = [], []
        for e in page.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                errors.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                url = params.get("request", {}).get("url", "")
                if not url.startswith(("data:", "file:")):
                    requests.append(url)
        page.ws.close()
        return Rendered(measured["text"], measured["pageWidth"], measured["viewWidth"], measured["images"],
                        measured["imagesLoaded"], measured["tables"], errors, requests,
                        base64.b64decode(shot["data"]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
