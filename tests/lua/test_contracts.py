"""The scripts' `local` lines name KEYS and ARGV as their contracts do; docs/scripts.md is
the rendered contracts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from groupbuy.storage.specs import ScriptSpec, script_names, script_source
from scripts.script_docs import DOC, REGENERATE, all_contracts, render

_NAMED = re.compile(r"^local (\w+) = (KEYS|ARGV)\[(\d+)\]$", re.MULTILINE)
_TAIL = re.compile(r"^local (\w+)_at = (\d+)$", re.MULTILINE)
_RETURNED = re.compile(r"\breturn \{([A-Z_]+)\b")
_NAMED_CODE = re.compile(r"\{([A-Z_]+)\b")
# The scripts whose replies start with a named code (the others answer {1} or {0}).
_NAMED_CODES = [
    name
    for name in script_names()
    if name.startswith(("team_", "packet_", "activity_counts", "user_"))
]


def named_slots(source: str) -> dict[str, list[tuple[int, str]]]:
    """KEYS and ARGV named by `local x = KEYS[i]` lines: (i, x) in order of appearance."""
    found: dict[str, list[tuple[int, str]]] = {"KEYS": [], "ARGV": []}
    for name, table, index in _NAMED.findall(source):
        found[table].append((int(index), name))
    return found


def test_every_script_has_a_contract() -> None:
    assert sorted(all_contracts()) == script_names()


@pytest.mark.parametrize("name", script_names())
def test_local_lines_match_the_contract(name: str) -> None:
    contract: ScriptSpec[Any] = all_contracts()[name]
    source = script_source(name, flags=False)
    named = named_slots(source)
    assert named["KEYS"] == list(enumerate(contract.key_names, 1))
    assert named["ARGV"] == list(enumerate(contract.arg_names, 1))
    tails = dict(_TAIL.findall(source))
    for kind, more, count in (
        ("KEYS", contract.more_keys, len(contract.keys)),
        ("ARGV", contract.more_args, len(contract.args)),
    ):
        if more is not None:
            assert tails.get(more.name) == str(count + 1), (kind, more.name)
    assert set(tails) <= {m.name for m in (contract.more_keys, contract.more_args) if m}


@pytest.mark.parametrize("name", _NAMED_CODES)
def test_the_script_answers_the_codes_its_spec_lists(name: str) -> None:
    """Every code the script returns, or its header names, is one its spec reads; every
    code its spec reads is named in the script (or in a library it requires)."""
    spec = all_contracts()[name]
    source = script_source(name, flags=False)
    own = source[source.index(f"-- {name}:") :]
    listed = {code.name for code in spec.replies}
    assert set(_RETURNED.findall(own)) <= listed
    assert set(_NAMED_CODE.findall(own)) <= listed
    assert listed <= set(_NAMED_CODE.findall(source))


def test_no_script_indexes_keys_or_argv_by_a_literal_outside_its_local_lines() -> None:
    for name in script_names():
        source = script_source(name, flags=False)
        code = [line for line in source.splitlines() if not line.lstrip().startswith("--")]
        loose = [
            line for line in code if re.search(r"(KEYS|ARGV)\[\d", line) and not _NAMED.match(line)
        ]
        assert loose == [], name


def test_parser_sees_drift() -> None:
    source = "local team_hash = KEYS[2]\nlocal team_members = KEYS[1]\n"
    assert named_slots(source)["KEYS"] == [(2, "team_hash"), (1, "team_members")]


def test_docs_scripts_md_is_the_rendered_contracts() -> None:
    on_disk = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert render() == on_disk, f"docs/scripts.md is out of date; regenerate it: {REGENERATE}"
