"""Property-based test of the sale's lifecycle (SPEC §3, §4 guarantees 1, 2 and 12).

A hypothesis state machine drives the team engine on fakeredis, with Redis's clock frozen
(tests/support/engine_stack.py), through opens, locks, joins, confirms, unlocks,
extensions, leaves, dissolves and time, on an activity with a stock. Refusals are
expected; after every step it reads the activity and every team back and checks that no
team is over-filled, that nobody holds two live locks, and that the units held never
pass the stock and add up to what the activity reports left.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from groupbuy import errors
from groupbuy.locks.sale import Sale
from tests.support.engine_stack import EngineStack

ACTIVITY = "sale"
SIZE = 3
USERS = [f"u{i}" for i in range(8)]
TEAMS = ["t0", "t1", "t2"]
USER = st.sampled_from(USERS)
TEAM = st.sampled_from(TEAMS)


class SaleMachine(RuleBasedStateMachine):
    """Random steps of a sale with a stock; the guarantees checked after each one."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: EngineStack | None = None
        self.stock = 0

    def teardown(self) -> None:
        if self.stack is not None:
            self.stack.close()

    def call(self, step: Awaitable[Any]) -> None:
        """Run one service call; a refusal (a GroupBuyError) is an answer, not a failure."""
        assert self.stack is not None
        with contextlib.suppress(errors.GroupBuyError):
            self.stack.run(step)

    @property
    def teams(self) -> Any:
        assert self.stack is not None
        return self.stack.services.teams

    @initialize(stock=st.integers(3, 7), late=st.booleans())
    def open_sale(self, stock: int, late: bool) -> None:
        self.stack = EngineStack()
        self.stock = stock
        sale = Sale(stock=stock, max_hold_s=30, late_confirm=late)
        self.stack.run(
            self.teams.activities.create_activity(
                ACTIVITY, team_size=SIZE, lock_ttl_s=10, team_deadline_s=60, sale=sale
            )
        )
        for n, tid in enumerate(TEAMS):
            self.call(self.teams.activities.open_team(ACTIVITY, f"L{n}", tid, f"oL{n}"))

    @rule(user=USER, team=TEAM)
    def lock(self, user: str, team: str) -> None:
        self.call(self.teams.seats.lock(ACTIVITY, team, user))

    @rule(user=USER)
    def join(self, user: str) -> None:
        self.call(self.teams.seats.join(ACTIVITY, user))

    @rule(user=USER, team=TEAM)
    def confirm(self, user: str, team: str) -> None:
        self.call(self.teams.seats.confirm(ACTIVITY, team, user, f"o-{user}"))

    @rule(user=USER, team=TEAM)
    def unlock(self, user: str, team: str) -> None:
        self.call(self.teams.seats.unlock(ACTIVITY, team, user))

    @rule(user=USER, team=TEAM, hold_s=st.integers(10, 30))
    def extend(self, user: str, team: str, hold_s: int) -> None:
        self.call(self.teams.seats.extend(ACTIVITY, team, user, hold_s))

    @rule(user=USER, team=TEAM)
    def leave(self, user: str, team: str) -> None:
        self.call(self.teams.seats.leave(ACTIVITY, team, user, f"o-{user}", "refund"))

    @rule(team=TEAM)
    def dissolve(self, team: str) -> None:
        self.call(self.teams.dissolve(ACTIVITY, team))

    @rule(seconds=st.sampled_from([1, 5, 11, 31, 61]))
    def time_passes(self, seconds: int) -> None:
        assert self.stack is not None
        self.stack.services.clock.advance(seconds)

    @invariant()
    def the_guarantees_hold(self) -> None:
        if self.stack is None:
            return
        activity = self.stack.run(self.teams.activities.get_activity(ACTIVITY))
        held = activity["members"] + activity["live_locks"]
        assert held <= self.stock, activity  # §4.12
        assert activity["stock_left"] == self.stock - held, activity
        assert activity["stock_held_by_locks"] == activity["live_locks"], activity
        holders: Counter[str] = Counter()
        for tid in TEAMS:
            team = self.stack.run(self.teams.activities.get_team(ACTIVITY, tid))
            members = [m["user_id"] for m in team["members"]]
            assert len(members) == len(set(members)), team  # nobody a member twice
            if team["status"] == "open":  # §4.1
                taken = len(members) + len(team["locks"])
                assert taken + team["free_seats"] == SIZE and taken <= SIZE, team
            elif team["status"] == "formed":
                assert len(members) == SIZE, team
            holders.update(lock["user_id"] for lock in team["locks"])
        assert all(n == 1 for n in holders.values()), holders  # §4.2


TestSaleMachine = SaleMachine.TestCase
TestSaleMachine.settings = hypothesis_settings(
    max_examples=25, stateful_step_count=25, deadline=None
)
