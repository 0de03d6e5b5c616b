"""A real headless Chromium for the tests of the pages ninelives writes.

:func:`find` returns the browser's path or fails the test (never skips: the test
command installs one, see scripts/system-deps.sh). :func:`dom` loads a URL and
returns the document as the browser serialised it after loading (scripts, had
any run, would have changed it); :func:`screenshot` saves a PNG.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CANDIDATES = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
)
# Headless, and quiet on a closed network: no background connections, no updates.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find() -> str:
    """The Chromium (or Chrome) to drive; fails the calling test if there is none."""
    for candidate in CANDIDATES:
        found = shutil.which(candidate) or (candidate if Path(candidate).exists() else None)
        if found:
            return found
    pytest.fail(
        "no Chromium or Chrome found: the report and web view tests need one "
        "(make test installs it with apt-get as root; else install chromium)",
        pytrace=False,
    )


def _run(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="ninelives-chromium-") as profile:
        result = subprocess.run(
            [find(), *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def dom(url: str) -> str:
    """The page's DOM after load, serialised by the browser."""
    return _run(["--dump-dom", url]).stdout


def screenshot(url: str, path: Path, *, width: int = 1200, height: int = 900) -> Path:
    """A PNG of the page's first ``width`` x ``height`` pixels."""
    _run([f"--window-size={width},{height}", f"--screenshot={path}", url])
    assert path.stat().st_size > 1000, f"empty screenshot {path}"
    return path
