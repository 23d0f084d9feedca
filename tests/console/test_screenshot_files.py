"""The screenshots live where the docs show them: the command's default directory holds one
PNG per shot, and every image README.md and docs/**/*.md show is there."""

from __future__ import annotations

import re
from pathlib import Path

from scripts import screenshots as demo_screenshots
from tests.support.screenshots import OUT, SHOTS

REPO = Path(__file__).resolve().parents[2]
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _shown(page: Path) -> list[Path]:
    """The local images a Markdown page shows, as paths from the repository's root."""
    links = _IMAGE.findall(page.read_text())
    return [(page.parent / link).resolve() for link in links if "://" not in link]


def test_the_default_directory_holds_one_png_per_shot() -> None:
    """docs/console/ holds the pictures of both commands, and nothing else: the pages with
    fixed data (tests/support/screenshots.py) and the console during `groupbuy demo`
    (scripts/screenshots.py)."""
    assert Path("docs/console") == OUT == demo_screenshots.OUT
    held = sorted(path.name for path in (REPO / OUT).glob("*.png"))
    names = [shot.name for shot in SHOTS] + [shot.name for shot in demo_screenshots.SHOTS]
    assert held == sorted(f"{name}.png" for name in names)


def test_every_image_the_docs_show_is_a_screenshot_of_the_command() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    shown = {image for page in pages for image in _shown(page) if image.suffix == ".png"}
    screenshots = {image for image in shown if image.parent == (REPO / OUT).resolve()}
    missing = sorted(str(image.relative_to(REPO)) for image in shown if not image.is_file())
    assert not missing
    # README.md and docs/console.md show the console; docs/browser.md shows / and /docs.
    assert {image.name for image in screenshots} >= {
        "console-overview.png",
        "console-activity.png",
        "home.png",
        "docs.png",
    }
    assert not (REPO / "docs" / "screenshots").exists()
