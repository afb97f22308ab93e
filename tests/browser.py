"""Headless Chromium, for the tests that open a report as a reader would."""

from __future__ import annotations

import shutil

# Headless Chromium as this machine allows it: no sandbox as root, no network (its background
# connections would only be refused), a fresh profile each time.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
