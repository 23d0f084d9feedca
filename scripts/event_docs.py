"""The table of event types, rendered from groupbuy.event_types: `python -m scripts.event_docs`.

docs/webhooks.md holds it between two markers (the rest of the page is written by hand);
docs/api.md gets it from scripts/api_reference.py. `--check` fails when the page is stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from groupbuy.event_types import EVENT_TYPES, VERSIONS, DataField

REGENERATE = "python -m scripts.event_docs"
ROOT = Path(__file__).resolve().parents[1]
WEBHOOKS_PAGE = ROOT / "docs" / "webhooks.md"
BEGIN = f"<!-- event types: generated from groupbuy/event_types.py; regenerate: {REGENERATE} -->"
END = "<!-- end of event types -->"


def _field(field: DataField) -> str:
    return f"`{field.name}` ({field.type}): {field.meaning}"


def render_table() -> list[str]:
    """The table: each type, when it is written, and its `data` fields; then what a
    `version` means."""
    rows = [
        f"| `{event.name}` | {event.when} | {'; '.join(_field(f) for f in event.data)} |"
        for event in EVENT_TYPES.values()
    ]
    header = ["| Type | Written when | `data` fields |", "| --- | --- | --- |"]
    return [*header, *rows, "", VERSIONS]


def with_table(page: str) -> str:
    """The page with the text between its markers replaced by the current table."""
    head, begin, rest = page.partition(BEGIN)
    _old, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page lacks the markers {BEGIN!r} and {END!r}")
    return "\n".join([head + BEGIN, *render_table(), END + tail])


def main(argv: Sequence[str] | None = None) -> int:
    """Write the table into docs/webhooks.md, or with --check say whether it is current."""
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = WEBHOOKS_PAGE.read_text(encoding="utf-8")
    current = with_table(page)
    if args.check:
        if current != page:
            sys.stderr.write(f"{WEBHOOKS_PAGE} is out of date; regenerate it: {REGENERATE}\n")
            return 1
        return 0
    WEBHOOKS_PAGE.write_text(current, encoding="utf-8")
    sys.stdout.write(f"wrote {WEBHOOKS_PAGE}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
