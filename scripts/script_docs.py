"""docs/scripts.md, rendered from the script contracts: `python -m scripts.script_docs`.

The contracts live with their engines (groupbuy.locks.engine, groupbuy.redpacket.engine)
and in groupbuy.storage.calls; this command gathers them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from groupbuy.locks import engine as team_engine
from groupbuy.redpacket import engine as packet_engine
from groupbuy.storage import calls, throttles
from groupbuy.storage.specs import ScriptSpec, Shape, Slot

REGENERATE = "python -m scripts.script_docs"
DOC = Path(__file__).resolve().parents[1] / "docs" / "scripts.md"


def all_contracts() -> dict[str, ScriptSpec[Any]]:
    """Every script's spec by script name."""
    found = [
        *team_engine.CONTRACTS,
        *packet_engine.CONTRACTS,
        *calls.CONTRACTS,
        *throttles.CONTRACTS,
    ]
    return {contract.name: contract for contract in sorted(found, key=lambda c: c.name)}


def _rows(
    kind: str, named: tuple[Slot, ...], more: Slot | None, optional: tuple[str, ...]
) -> list[str]:
    rows = [
        f"| {kind}[{i}] | `{slot.name}` | {slot.meaning}"
        f"{' (optional)' if slot.name in optional else ''} |"
        for i, slot in enumerate(named, 1)
    ]
    if more is not None:
        rows.append(f"| {kind}[{len(named) + 1}..] | `{more.name}` | {more.meaning} |")
    return rows


def _reply_row(code: str | None, shape: Shape) -> str:
    named = [f"{f.name}{'...' if f.rest else ''}" for f in shape.fields]
    return f"| `{{{', '.join([code, *named] if code else named)}}}` | {shape.meaning} |"


def render() -> str:
    """The text of docs/scripts.md."""
    out = [
        "# Lua scripts: KEYS, ARGV and replies",
        "",
        f"Generated from the script specs; do not edit. Regenerate: `{REGENERATE}`.",
        "Each script names these entries in `local` lines at its top (the shared ones in",
        "lua/_team_keys.lua, lua/_pick_keys.lua and lua/_packet_lib.lua).",
        "A reply starts with its code, by name; `YES` and `NO` are `1` and `0`, `TAKEN` and",
        "`LIMITED` `0` and `1`. A reply without a code lists its fields only.",
        "",
    ]
    for contract in all_contracts().values():
        out += [f"## {contract.name}", "", contract.summary, ""]
        out += ["| Slot | Name | Meaning |", "| --- | --- | --- |"]
        out += _rows("KEYS", contract.keys, contract.more_keys, contract.optional_keys)
        out += _rows("ARGV", contract.args, contract.more_args, ())
        out += ["", "| Reply | Means |", "| --- | --- |"]
        out += [_reply_row(code.name, shape) for code, shape in contract.replies.items()]
        if contract.reply is not None:
            out += [_reply_row(None, contract.reply)]
        out += [""]
    return "\n".join(out)


def main() -> None:
    """Write docs/scripts.md."""
    DOC.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {DOC}\n")


if __name__ == "__main__":
    main()
