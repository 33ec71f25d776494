"""What the browser tests need: a Chromium to drive, and where their screenshots go.

The browser tests (``@pytest.mark.browser``, ``tests/test_browser_admin.py``)
drive Debian's ``chromium`` with Playwright's Python package -- never a
browser that Playwright downloads itself (``playwright install`` fetches a
build of its own, which a machine without that download cannot get). When
no Chromium can be found, or Playwright is not installed, the tests are
*skipped with the reason*, so a run without a browser says so instead of
passing silently. ``./scripts/test`` installs ``chromium`` first when it is
missing and it runs as root with apt-get.

Screenshots of every step go to ``artifacts/screenshots/`` at the checkout's
root (git-ignored; ``VERTIQUE_SCREENSHOT_DIR`` moves them), which CI keeps as
its artifacts. With ``VERTIQUE_UPDATE_GUIDE_IMAGES=1`` the few screenshots
that ``docs/operators-guide.md`` embeds are also written to ``docs/images/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE_IMAGES = ROOT / "docs" / "images"

# where a Chromium is looked for, in order, after VERTIQUE_CHROMIUM
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")

NO_CHROMIUM = (
    "no Chromium found (looked at VERTIQUE_CHROMIUM, {names} on PATH, {paths}): "
    "install Debian's chromium (apt-get install -y chromium; ./scripts/test does it as root) "
    "or set VERTIQUE_CHROMIUM to a Chromium executable"
)
NO_PLAYWRIGHT = (
    "Playwright's Python package is not installed (pip install -e '.[test]'); "
    "no browser download is needed, the tests drive the system Chromium"
)


def find_chromium() -> str | None:
    """The Chromium executable to drive, or None when there is none on this machine.

    ``VERTIQUE_CHROMIUM`` wins when set (and must then exist: a typo should
    not fall back to another browser silently).
    """
    chosen = os.environ.get("VERTIQUE_CHROMIUM", "").strip()
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    return None


def why_no_browser() -> str | None:
    """The reason the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return NO_PLAYWRIGHT
    if find_chromium() is None:
        return NO_CHROMIUM.format(names=", ".join(CHROMIUM_NAMES), paths=", ".join(CHROMIUM_PATHS))
    return None


def screenshot_dir() -> Path:
    """Where every step's screenshot is written (created on demand)."""
    directory = Path(
        os.environ.get("VERTIQUE_SCREENSHOT_DIR") or ROOT / "artifacts" / "screenshots"
    )
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def update_guide_images() -> bool:
    """Whether this run refreshes the PNGs that docs/operators-guide.md embeds."""
    return os.environ.get("VERTIQUE_UPDATE_GUIDE_IMAGES", "") not in ("", "0")
