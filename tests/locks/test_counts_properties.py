"""Property-based test of an activity's live counts (SPEC §3 Activities): random opens,
locks, joins, unlocks, confirms, sweeps and time steps through the real scripts, on
fakeredis (with Lua) and on a real redis-server; after every step the counts, read first,
equal what the teams say when each is read afterwards.

Time moves in steps of 10 s while locks last 30 s and teams 120 s: every expiry and
deadline then falls on a whole step, never between the counts read and the team reads
that follow it, as long as one example takes under 10 s of the machine's own time (its
real time runs on under the scripts' shifted clock); each example checks that it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from groupbuy import errors
from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from tests.support.counts import check_counts
from tests.support.redis import make_async_redis
from tests.support.schema import database_with_schema

T = TypeVar("T")

STEP_S = 10
USERS = 8
MAX_TEAMS = 5
USER = st.integers(0, USERS - 1)
TEAM = st.integers(0, MAX_TEAMS - 1)


class _Stack:
    """The services on their own event loop, a new SQLite file, and `redis_url` ('':
    a new fakeredis)."""

    def __init__(self, redis_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._exit = contextlib.ExitStack()
        tmp = Path(tempfile.mkdtemp(prefix="groupbuy-counts-"))
        self._exit.callback(shutil.rmtree, tmp, ignore_errors=True)
        self._exit.callback(self.loop.close)
        settings = load_settings(
            None,
            {"GROUPBUY_DATABASE_URL": database_with_schema(tmp), "GROUPBUY_REDIS_URL": redis_url},
        )
        self.redis = make_async_redis(redis_url)
        database = Database(settings.database.effective_url)
        self.services: Services = build_services(settings, redis=self.redis, database=database)
        self._exit.callback(lambda: self.run(self.redis.aclose()))
        self._exit.callback(lambda: self.run(database.dispose()))
        self.run(self.services.scripts.load())

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self._exit.close()


class CountsMachine(RuleBasedStateMachine):
    """One activity, driven at random; its counts checked against its teams."""

    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.stack: _Stack | None = None
        self.aid = f"cp{uuid.uuid4().hex[:10]}"  # a new activity on a shared real server
        self.team_ids: list[str] = []
        self.check_after_step = True
        self.began = time.monotonic()

    def teardown(self) -> None:
        if self.stack is not None:
            assert time.monotonic() - self.began < STEP_S, "the example outran its time steps"
            self.stack.close()

    @property
    def services(self) -> Services:
        assert self.stack is not None
        return self.stack.services

    def _try(self, call: Awaitable[Any]) -> None:
        assert self.stack is not None
        with contextlib.suppress(errors.GroupBuyError):
            self.stack.run(call)

    def _team(self, index: int) -> str:
        return self.team_ids[index % len(self.team_ids)]

    @initialize(size=st.integers(2, 4), virtual=st.booleans(), leaders=st.integers(1, 3))
    def create(self, size: int, virtual: bool, leaders: int) -> None:
        self.stack = _Stack(self.redis_url)
        self.stack.run(
            self.services.teams.activities.create_activity(
                self.aid,
                team_size=size,
                lock_ttl_s=3 * STEP_S,
                team_deadline_s=12 * STEP_S,
                virtual_min_members=2 if virtual else None,
            )
        )
        for leader in range(leaders):
            self.open(leader)

    @rule(leader=USER)
    def open(self, leader: int) -> None:
        if len(self.team_ids) < MAX_TEAMS:
            tid = f"t{len(self.team_ids)}"
            self._try(self.services.teams.activities.open_team(self.aid, f"u{leader}", tid))
            self.team_ids.append(tid)

    @rule(user=USER, team=TEAM)
    def lock(self, user: int, team: int) -> None:
        self._try(self.services.teams.seats.lock(self.aid, self._team(team), f"u{user}"))

    @rule(user=USER)
    def join(self, user: int) -> None:
        self._try(self.services.teams.seats.join(self.aid, f"u{user}"))

    @rule(user=USER, team=TEAM)
    def unlock(self, user: int, team: int) -> None:
        self._try(self.services.teams.seats.unlock(self.aid, self._team(team), f"u{user}"))

    @rule(user=USER)
    def pay(self, user: int) -> None:
        """The user pays for the seat they hold, wherever it is (or is refused)."""
        assert self.stack is not None
        seats = self.services.teams.seats
        with contextlib.suppress(errors.GroupBuyError):
            held = self.stack.run(seats.current_lock(self.aid, f"u{user}"))
            self._try(seats.confirm(self.aid, held["team_id"], f"u{user}", f"o{user}"))

    @rule(steps=st.integers(1, 6), look=st.booleans())
    def advance(self, steps: int, look: bool) -> None:
        """Time passes; without a look, the next change meets what it did first."""
        self.services.clock.advance(steps * STEP_S)
        self.check_after_step = look

    @rule(deadlines=st.booleans())
    def sweep(self, deadlines: bool) -> None:
        assert self.stack is not None
        sweeps = self.services.teams.sweeps
        self.stack.run(sweeps.expire_due(100) if deadlines else sweeps.expire_locks(100))

    @invariant()
    def counts_equal_what_the_teams_say(self) -> None:
        if self.stack is None or not self.team_ids:
            return
        if not self.check_after_step:
            self.check_after_step = True
            return
        self.stack.run(check_counts(self.services, self.aid, self.team_ids))


SETTINGS = hypothesis_settings(max_examples=25, stateful_step_count=25, deadline=None)


def test_counts_on_fakeredis() -> None:
    run_state_machine_as_test(CountsMachine, settings=SETTINGS)


@pytest.mark.real
def test_counts_on_a_real_server(real_redis_url: str) -> None:
    class OnRealServer(CountsMachine):
        redis_url = real_redis_url

    run_state_machine_as_test(OnRealServer, settings=SETTINGS)
