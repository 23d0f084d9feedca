"""Starting a server a test needs: skipped where it is not installed, but never in CI."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

NO_REDIS = "no Redis-compatible server can run here"


def started_or_skip(start: Callable[[], T], missing: str) -> T:
    """`start()`; where what it runs is not installed (FileNotFoundError) the test skips,
    saying `missing`, except in CI (`CI` set), where that is an error: CI must run them all."""
    try:
        return start()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip(missing)
