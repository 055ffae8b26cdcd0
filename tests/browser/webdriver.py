"""A minimal W3C WebDriver client for Debian's chromium + chromium-driver (no Python package).

Only what the UI checks need: open a page, read its visible text, take a screenshot. The
browser runs headless with a fresh profile and without background network traffic, and only
ever loads loopback addresses.
"""
from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from rose.stack.ports import free_port

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"]


def find_chromium() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Browser:
    def __init__(self, browser: str, driver: str, timeout: float = 30.0):
        self.profile = tempfile.mkdtemp(prefix="rose-chromium-")
        port = free_port()
        self.driver = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout,
                                 trust_env=False)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline or self.driver.poll() is not None:
                self.close()
                raise RuntimeError(f"chromedriver {driver} did not become ready")
            time.sleep(0.1)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": browser, "args": [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}"]}}
        try:
            self.session = self._call("POST", "/session",
                                      {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, path: str, body: dict | None = None):
        resp = self.http.request(method, path, json=body)
        value = resp.json().get("value")
        if resp.status_code >= 400:
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def script(self, js: str):
        """Run `js` (a function body) in the page; what it returns."""
        return self._call("POST", f"/session/{self.session}/execute/sync",
                          {"script": js, "args": []})

    def text(self) -> str:
        return self.script("return document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout: float = 60.0) -> str:
        """The page's text once it contains every needle (the UI renders asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if all(n in text for n in needles):
                return text
            if time.monotonic() > deadline:
                missing = [n for n in needles if n not in text]
                raise AssertionError(f"page lacks {missing}; it shows: {text[:800]!r}")
            time.sleep(0.5)

    def resize(self, width: int, height: int) -> None:
        """The window's size (a taller one screenshots a whole long page)."""
        self._call("POST", f"/session/{self.session}/window/rect",
                   {"width": width, "height": height})

    def screenshot(self, path: Path) -> Path:
        png = self._call("GET", f"/session/{self.session}/screenshot")
        Path(path).write_bytes(base64.b64decode(png))
        return Path(path)

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self._call("DELETE", f"/session/{self.session}")
        except (httpx.HTTPError, RuntimeError, ValueError):
            pass
        self.http.close()
        self.driver.terminate()
        try:
            self.driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
