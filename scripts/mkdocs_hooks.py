"""mkdocs hooks: README.md is not a page of the site, so its links are checked here.

`mkdocs build --strict` checks the links between the pages under docs/. README.md links
into docs/ by relative path; this hook fails the build when one of those targets (a
file, or a heading of a Markdown file) does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor of a heading, as GitHub and the site's `toc` slugify make it."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def broken_links(readme: Path) -> list[str]:
    """The relative links of a Markdown file whose file or heading does not exist."""
    text = FENCE.sub("", readme.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # another site, or a heading of the README itself
        path, _hash, anchor = target.partition("#")
        file = readme.parent / path
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md":
            body = FENCE.sub("", file.read_text(encoding="utf-8"))
            if anchor not in {slug(h) for h in HEADING.findall(body)}:
                broken.append(f"{target}: no such heading")
    return broken


def on_config(config: Any) -> Any:
    """Fail the build when README.md links to a file or heading that does not exist."""
    readme = Path(config.config_file_path).parent / "README.md"
    broken = broken_links(readme)
    if broken:
        raise PluginError("README.md has broken links:\n  " + "\n  ".join(broken))
    return config
