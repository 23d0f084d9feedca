"""The screenshot command: a service with demo data, one 1280x800 PNG per page of SHOTS."""

from __future__ import annotations

import struct
from pathlib import Path

from selenium import webdriver

from tests.support.browser import HEIGHT, WIDTH
from tests.support.screenshots import SHOTS, main


def test_the_command_writes_one_png_per_shot(chromium: webdriver.Chrome, tmp_path: Path) -> None:
    # `chromium` only for its skip (or CI failure) when no browser is installed.
    assert main(["--out", str(tmp_path / "shots")]) == 0
    written = sorted((tmp_path / "shots").iterdir())
    assert [path.name for path in written] == sorted(f"{shot.name}.png" for shot in SHOTS)
    for path in written:
        head = path.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n", path
        assert struct.unpack(">II", head[16:24]) == (WIDTH, HEIGHT), path
