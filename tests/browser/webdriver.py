"""Headless Debian chromium driven by selenium through the system chromium-driver.

Only what the UI checks need: open a page, run a script, read its visible text, take a
screenshot. The browser runs headless with a fresh profile and without background network
traffic, and only ever loads loopback addresses. Both binaries are given explicitly, so
selenium never looks for (or downloads) a driver of its own.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

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
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        os.environ.setdefault("SE_AVOID_STATS", "true")  # no usage pings from selenium
        self.profile = tempfile.mkdtemp(prefix="rose-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for arg in [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}"]:
            options.add_argument(arg)
        try:
            self.driver = webdriver.Chrome(service=Service(executable_path=driver),
                                           options=options)
        except BaseException:
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        self.driver.set_page_load_timeout(timeout)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def script(self, js: str):
        """Run `js` (a function body) in the page; what it returns."""
        return self.driver.execute_script(js)

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
        self.driver.set_window_size(width, height)

    def screenshot(self, path: Path) -> Path:
        self.driver.save_screenshot(str(path))
        return Path(path)

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
