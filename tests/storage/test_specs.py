"""The one reply parser: a script's spec reads `[code, field, ...]` into a Reply."""

from __future__ import annotations

from enum import IntEnum

import pytest

from groupbuy.storage.specs import Field, Reply, ReplyError, ScriptSpec, flag, optional_int, shape


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
