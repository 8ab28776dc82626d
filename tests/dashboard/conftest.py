"""A real headless Chromium for the dashboard tests, driven through Selenium + chromedriver.

Why Selenium and not Playwright: Debian ships ``chromium`` and a ``chromium-driver`` built from
the same source version, so the driver always matches the browser apt installed; Playwright's
Python package pins its own Chromium revision and only drives a system one on a best-effort
basis (and downloads browsers by default, which CI cannot do). Selenium is pure Python.

Missing browser, driver or selenium: a skip naming what to install -- a failure under CI
(``CI`` set), where scripts/install.sh installs them.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Iterator

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)
_HINT = "run scripts/install.sh (apt-get install chromium chromium-driver; pip install selenium)"


def _missing(what: str) -> None:
    msg = f"{what} not installed ({_HINT})"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _which(names: tuple[str, ...]) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The session's Chromium on a blank page with an empty console log; left on a blank page
    afterwards, so a page whose service has stopped does not keep logging failed polls into
    the next test's console."""
    chromium.get("about:blank")
    chromium.get_log("browser")  # reading drains it
    yield chromium
    chromium.get("about:blank")


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """A headless Chromium (Selenium WebDriver) that records the page's console messages."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium (the test extra)")
    binary = _which(BROWSERS)
    driver_path = _which(DRIVERS)
    if binary is None:
        _missing("chromium")
    if driver_path is None:
        _missing("chromedriver (Debian: chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=420,900", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)  # 420 px wide: the narrow-screen layout is what the tests look at
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    drv.set_page_load_timeout(30)
    drv.set_script_timeout(10)
    try:
        yield drv
    finally:
        drv.quit()
