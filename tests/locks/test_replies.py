"""The reply parsers: each shape from its fields, and a reply off its contract raises."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.locks import replies
from groupbuy.locks.codes import TeamCode
from groupbuy.locks.replies import LimitReached, Locked, LookFurther, NoSeatFree, TeamReply


def test_a_lock_reply_reads_its_fields_by_name() -> None:
    new = replies.parse_lock([0, 1_000, 11_000, "t0", 4], "t1")
    assert new == Locked(TeamCode.OK, "t1", 1_000, 11_000, 4, "t0")
    held = replies.parse_lock([1, "1000", "11000", "3"], "t1")
    assert held == Locked(TeamCode.EXISTING, "t1", 1_000, 11_000, 3, "")
    over = replies.parse_lock([14, 2, 2, "teams_per_user"], "t1")
    assert over == LimitReached(TeamCode.USER_LIMIT_REACHED, 2, 2, "teams_per_user")
    assert replies.parse_lock([6], "t1") == TeamReply(TeamCode.TEAM_NOT_FOUND)


def test_a_join_reply_reads_its_fields_by_name() -> None:
    assert replies.parse_join([12, ""]) == NoSeatFree(TeamCode.NO_TEAM_AVAILABLE, None)
    assert replies.parse_join([12, 5]) == NoSeatFree(TeamCode.NO_TEAM_AVAILABLE, 5)
    further = replies.parse_join([13, "-42", "t9"])
    assert further == LookFurther(TeamCode.LOOK_FURTHER, "-42", "t9")
    assert isinstance(further, LookFurther) and further.cursor == ("-42", "t9")


@pytest.mark.parametrize(
    "reply",
    [
        [99],  # a code no script answers
        [6, "extra"],  # a bare code with fields
        [0, 1_000, 11_000, 4],  # OK one field short
        [10],  # SWITCH_NEEDED without the team
        [14, 1, 1],  # USER_LIMIT_REACHED without the limit's name
    ],
)
def test_a_reply_off_its_contract_raises(reply: list[Any]) -> None:
    with pytest.raises(ValueError):
        replies.parse_lock(reply, "t1")
