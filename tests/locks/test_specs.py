"""The team scripts' specs read their replies: each code's fields by name, and a reply off
its spec raises."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.join import TEAM_JOIN
from groupbuy.locks.lock import TEAM_LOCK
from groupbuy.storage.specs import Reply


def lock(raw: list[Any]) -> Reply[TeamCode]:
    """team_lock's reply as TeamScripts.lock reads it."""
    return TEAM_LOCK.parse(raw, team_id="t1")


def test_a_lock_reply_reads_its_fields_by_name() -> None:
    new = lock([0, 1_000, 11_000, "t0", 4])
    assert new == Reply(
        TeamCode.OK,
        team_id="t1",
        locked_at_ms=1_000,
        expires_at_ms=11_000,
        version=4,
        released_team_id="t0",
    )
    held = lock([1, "1000", "11000", "3"])
    assert held == Reply(
        TeamCode.EXISTING,
        team_id="t1",
        locked_at_ms=1_000,
        expires_at_ms=11_000,
        version=3,
    )
    over = lock([14, 2, 2, "teams_per_user"])
    assert (over.code, over.limit, over.current, over.limit_name) == (
        TeamCode.USER_LIMIT_REACHED,
        2,
        2,
        "teams_per_user",
    )
    assert lock([6]).code is TeamCode.TEAM_NOT_FOUND


def test_a_join_reply_reads_its_fields_by_name() -> None:
    assert TEAM_JOIN.parse([12, ""]) == Reply(TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=None)
    assert TEAM_JOIN.parse([12, 5]) == Reply(TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=5)
    further = TEAM_JOIN.parse([13, "-42", "t9"])
    assert further == Reply(TeamCode.LOOK_FURTHER, score="-42", team_id="t9")
    assert (further.score, further.team_id) == ("-42", "t9")


@pytest.mark.parametrize(
    "reply",
    [
        [99],  # a code no script answers
        [6, "extra"],  # a bare code with fields
        [0, 1_000, 11_000, 4],  # OK one field short
        [10],  # SWITCH_NEEDED without the team
        [14, 1, 1],  # USER_LIMIT_REACHED without the limit's name
        [11],  # NO_LOCK: a code team_lock does not answer
    ],
)
def test_a_reply_off_its_contract_raises(reply: list[Any]) -> None:
    with pytest.raises(ValueError):
        lock(reply)
