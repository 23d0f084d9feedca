"""The one reply parser: a script's spec reads `[code, field, ...]` into a Reply."""

from __future__ import annotations

import ast
from enum import IntEnum
from pathlib import Path

import pytest

import groupbuy
from groupbuy.storage.specs import (
    Field,
    Fixed,
    Reply,
    ReplyError,
    ScriptSpec,
    flag,
    optional_int,
    shape,
)


class Code(IntEnum):
    OK = 0
    FULL = 1
    GONE = 2


SPEC = ScriptSpec(
    "demo",
    "A script for the test.",
    keys=(),
    args=(),
    replies={
        Code.OK: shape("done", ("count", int), ("ended", flag), Field("rest", list, rest=True)),
        Code.FULL: shape("full", ("next_ms", optional_int)),
    },
)


def test_fields_are_read_by_name_in_order() -> None:
    done = SPEC.parse([0, "3", "1", "a", "b"])
    assert done.code is Code.OK
    assert (done.count, done.ended, done.rest) == (3, True, ["a", "b"])
    assert SPEC.parse([0, 3, 0]) == Reply(Code.OK, count=3, ended=False, rest=[])
    assert SPEC.parse([1, ""]).next_ms is None


def test_a_shape_takes_the_known_fields_it_names() -> None:
    given = ScriptSpec("given", "", (), (), {Code.OK: shape("done", given=("team_id",))})
    assert given.parse([0], team_id="t1", other="x") == Reply(Code.OK, team_id="t1")
    assert SPEC.parse([1, 5], team_id="t1") == Reply(Code.FULL, next_ms=5)
    assert SPEC.parse([1, 5]).get("team_id", "") == ""


@pytest.mark.parametrize("raw", [[2], [9], [1], [1, 2, 3], [0, 1]])
def test_a_reply_off_its_spec_raises(raw: list[object]) -> None:
    with pytest.raises(ReplyError, match="demo answered"):
        SPEC.parse(raw)


def test_a_field_the_code_does_not_carry_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="a FULL reply has no field 'count'"):
        _ = SPEC.parse([1, 5]).count


class Rate(IntEnum):
    TAKEN = 0
    LIMITED = 1


FIXED: ScriptSpec[Fixed] = ScriptSpec(
    "fixed",
    "A script whose reply has no code.",
    keys=(),
    args=(),
    reply=shape("deleted, left", ("deleted", int), ("left", int)),
)
STATES = Field("states", lambda values: values, rest=True)
RATE = ScriptSpec(
    "rate",
    "A script whose reply is a code and a flat tail.",
    keys=(),
    args=(),
    replies={Rate.TAKEN: shape("taken", STATES), Rate.LIMITED: shape("limited", STATES)},
)


def test_a_reply_without_a_code_is_read_by_its_one_shape() -> None:
    read = FIXED.parse(["2", 5])
    assert read == Reply(Fixed.REPLY, deleted=2, left=5)
    assert (read.deleted, read.left) == (2, 5)
    entries: ScriptSpec[Fixed] = ScriptSpec(
        "listed", "", (), (), reply=shape("n, entries", ("count", int), ("entries", list))
    )
    assert entries.parse([1, [["1-0", ["f", "v"]]]]).entries == [["1-0", ["f", "v"]]]


@pytest.mark.parametrize("raw", [[], [1], [1, 2, 3]])
def test_a_reply_without_a_code_off_its_shape_raises(raw: list[object]) -> None:
    with pytest.raises(ReplyError, match="fixed answered"):
        FIXED.parse(raw)


@pytest.mark.parametrize("raw", [[], [2, 1, 1, 1]])
def test_a_coded_reply_off_its_spec_raises(raw: list[object]) -> None:
    with pytest.raises(ReplyError, match="rate answered"):
        RATE.parse(raw)


def test_a_tail_of_every_value_is_handed_over_whole() -> None:
    raw = [1, "3", "0", "250"]
    read = RATE.parse(raw)
    assert read.code is Rate.LIMITED
    assert read.states == ["3", "0", "250"]


def test_a_spec_has_replies_by_code_or_one_reply() -> None:
    with pytest.raises(TypeError, match="either"):
        ScriptSpec("both", "", (), (), replies={Code.OK: shape("ok")}, reply=shape("x"))
    with pytest.raises(TypeError, match="either"):
        ScriptSpec("neither", "", (), ())


def _spec_calls_outside_parse(tree: ast.Module) -> list[int]:
    """Lines where a script is run and its raw reply kept: `<spec>.call(...)`, or
    `<scripts>.call(...)` whose reply is not handed straight to a spec's `parse`."""
    parsed = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "parse"
        for arg in node.args
    }
    parsed |= {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Await) and id(node) in parsed
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and id(node) not in parsed
    ]


def test_no_module_reads_a_script_reply_but_through_its_spec() -> None:
    """Every script call under groupbuy/ answers its reply read by the spec (`run`, or
    `parse` around the call): none keeps the raw list to read it by position."""
    root = Path(groupbuy.__file__).parent
    # Where the one parser and the registry that runs the scripts live.
    allowed = {root / "storage" / "specs.py", root / "storage" / "scripts.py"}
    raw = {
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for line in _spec_calls_outside_parse(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert raw == set()


def test_the_scan_sees_a_raw_reply() -> None:
    kept = "async def f(s):\n    r = await SPEC.call(s, [], {})\n    return int(r[0])\n"
    read = "async def f(s):\n    return SPEC.parse(await s.call('x', [], []))\n"
    assert _spec_calls_outside_parse(ast.parse(kept)) == [2]
    assert _spec_calls_outside_parse(ast.parse(read)) == []
