"""How readable the Markdown is: lines, words per sentence, long sentences, longest table cell.

Usage: python scripts/prose_stats.py [FILE ...]   (default: README.md and docs/**/*.md)

Sentences are counted in paragraphs and list items only: fenced code blocks, HTML
comments, images, headings and tables are skipped. Tables are measured by their longest
cell, in characters. A sentence ends at `.`, `!` or `?` followed by a space, at the end
of a paragraph, and at the end of a list item.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

LONG = 40  # words: a sentence longer than this counts as long
FENCE = re.compile(r"^\s*(```|~~~)")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]*_`]*\s+")
WORD = re.compile(r"\S*[A-Za-z0-9\u4e00-\u9fff]\S*")
# A piece ending so does not end a sentence: an abbreviation, or a step's bold number.
NOT_AN_END = re.compile(r"(\be\.g\.|\bi\.e\.|\*\*\d+\.\*\*)$")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")


@dataclass
class Stats:
    """The figures of one file, or of several added up."""

    lines: int = 0
    sentences: list[int] = field(default_factory=list)  # words in each sentence
    longest_cell: int = 0

    def add(self, other: Stats) -> None:
        """Add another file's figures to these."""
        self.lines += other.lines
        self.sentences += other.sentences
        self.longest_cell = max(self.longest_cell, other.longest_cell)

    def row(self, name: str) -> str:
        """One line of the report."""
        count = len(self.sentences)
        average = sum(self.sentences) / count if count else 0.0
        over = sum(1 for words in self.sentences if words > LONG)
        return (
            f"{name:42} {self.lines:6} {sum(self.sentences):7} {count:6} "
            f"{average:6.1f} {over:5} {self.longest_cell:6}"
        )


def paragraphs(text: str, stats: Stats) -> list[str]:
    """The prose blocks of a Markdown text; its table cells are measured into `stats`."""
    text = COMMENT.sub("", text)
    blocks: list[str] = []
    current: list[str] = []
    in_fence = False

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        if FENCE.match(line):
            close()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        stripped = IMAGE.sub("", line).strip()
        if not stripped:
            close()
        elif stripped.startswith("|"):
            close()
            if not TABLE_RULE.match(stripped):
                cells = [cell.strip() for cell in stripped.strip("|").split("|")]
                stats.longest_cell = max(stats.longest_cell, *(len(c) for c in cells))
        elif stripped.startswith("#"):
            close()
        elif LIST_ITEM.match(stripped):
            close()
            current.append(LIST_ITEM.sub("", stripped))
        else:
            current.append(stripped.lstrip("> "))
    close()
    return blocks


def sentences(block: str) -> list[str]:
    """The sentences of one prose block."""
    found: list[str] = []
    for piece in SENTENCE_END.split(block):
        if found and NOT_AN_END.search(found[-1]):
            found[-1] += " " + piece
        else:
            found.append(piece)
    return found


def measure(path: Path) -> Stats:
    """The figures of one Markdown file."""
    text = path.read_text(encoding="utf-8")
    stats = Stats(lines=len(text.splitlines()))
    for block in paragraphs(text, stats):
        for sentence in sentences(block):
            words = len(WORD.findall(sentence))
            if words:
                stats.sentences.append(words)
    return stats


def default_files(root: Path) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main(argv: list[str]) -> int:
    """Print one row per file, then the totals for README.md and for docs/."""
    root = Path.cwd()
    files = [Path(name) for name in argv] or default_files(root)
    header = f"{'file':42} {'lines':>6} {'words':>7} {'sent.':>6} {'w/s':>6} {'>40':>5} {'cell':>6}"
    print(header)
    docs_total = Stats()
    for path in files:
        stats = measure(path)
        name = str(path.relative_to(root)) if path.is_absolute() else str(path)
        print(stats.row(name))
        if name.startswith("docs/"):
            docs_total.add(stats)
    if docs_total.lines:
        print(docs_total.row("docs/ (all files)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
