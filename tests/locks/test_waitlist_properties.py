"""Property-based test of the waitlist (SPEC §3 "Waitlist", §4 guarantee 13): random opens,
locks, joins, unlocks, confirms, leaves, queues, unqueues, entry expiries, sweeps and time
steps through the team and waitlist scripts (tests/support/team_scripts.py), on fakeredis
(with Lua) and on a real redis-server. After every step, from Redis and the outbox:

1. a lock or join that took a new seat left the team's line empty, and nobody in the
   activity's line who could take it (while anyone waits, no outsider takes a seat the
   line could take; an entry for any team that this team does not suit stays);
2. each line gives its offers in arrival order: no entry a seat suited waited in the same
   line with a smaller number (seq) than the entry offered it, then or later (an entry for
   any team is passed over for a team it is a member of, or left);
3. every entry ends at most once (offered, dropped, expired or removed), and an entry
   still in a line has not ended;
4. '~waiting' counts exactly the entries in the lines, and the due index holds each once;
5. no open team holds more members and locks than its size.

Time moves in steps of 10 s and every lifetime is a whole number of steps: each expiry
falls on a step, never between the calls of one step, as long as one example takes under
10 s of the machine's own time (its real time runs on under the scripts' shifted clock);
each example checks that it did.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
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

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.scripts import TeamReply
from tests.support.redis import empty, make_async_redis
from tests.support.team_scripts import AID, Harness

T = TypeVar("T")

STEP_MS = 10_000  # the only way time moves; longer than any example's own run
LOCK_TTL_MS = 3 * STEP_MS
ENTRY_TTL_MS = 3 * STEP_MS  # a waiting entry's lifetime (waitlist_ttl_ms)
DEADLINE_MS = 12 * STEP_MS  # long enough for locks and entries to expire first, mostly
WAITLIST_MAX = 4  # small, so that a full waitlist is met too
USERS = [f"u{i}" for i in range(8)]
MAX_TEAMS = 3
USER = st.sampled_from(USERS)
PICK = st.integers(0, 7)  # an index into whatever list the step picks from
# The refusals after which the service queues anyway (groupbuy/locks/waitlist.py, _NO_SEAT).
NO_SEAT = (TeamCode.TEAM_FULL, TeamCode.NO_TEAM_AVAILABLE, TeamCode.ACTIVITY_SOLD_OUT)
ENDINGS = {"lock.offered": "offered", "waitlist.dropped": "dropped", "waitlist.expired": "expired"}
SWITCH_ATTEMPTS = 3  # team_lock asks for the other team's keys once; a margin for a retry


class WaitlistMachine(RuleBasedStateMachine):
    """One activity with teams of 2 or 3 seats and a short waitlist, driven at random."""

    redis_url = ""  # '': a new fakeredis per example

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.h: Harness | None = None
        self.began = time.monotonic()
        self.team_ids: list[str] = []
        self.records_seen = 0
        # The waiting entries after the last step: user -> (seq, line), line '' = any team.
        self.waiting: dict[str, tuple[int, str]] = {}
        self.ended: dict[tuple[str, int], str] = {}  # (user, seq) -> how it ended
        self.offered: dict[str, list[tuple[int, str]]] = {}  # line -> (seq, team) offered

    def teardown(self) -> None:
        try:
            if self.h is not None:
                self.run(self.h.redis.aclose())
                assert time.monotonic() - self.began < STEP_MS / 1000, "example outran a step"
        finally:
            self.loop.close()

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    @property
    def harness(self) -> Harness:
        assert self.h is not None
        return self.h

    def _team(self, index: int) -> str:
        """One of the teams opened, picked by a drawn index."""
        return self.team_ids[index % len(self.team_ids)]

    def _line_key(self, line: str) -> str:
        """The zset of a line: the activity's ('') or a team's."""
        key = self.harness.keys.line(AID)
        return f"{key}:{line}" if line else key

    # -- steps ----------------------------------------------------------------------

    @initialize(offer_steps=st.integers(1, 3), size=st.integers(2, 3), leader=USER)
    def create(self, offer_steps: int, size: int, leader: str) -> None:
        """The activity (offers last 1-3 steps: as long as a lock, or not) and a first team."""
        if self.redis_url:
            empty(self.redis_url)
        self.h = Harness(make_async_redis(self.redis_url))
        self.run(self.harness.scripts.load())
        self.run(
            self.harness.activity(
                size,
                lock_ttl_ms=LOCK_TTL_MS,
                team_deadline_ms=DEADLINE_MS,
                waitlist_ttl_ms=ENTRY_TTL_MS,
                waitlist_max=WAITLIST_MAX,
                offer_ttl_ms=offer_steps * STEP_MS,
            )
        )
        self.open_team(leader, size)

    @rule(leader=USER, size=st.integers(2, 3))
    def open_team(self, leader: str, size: int) -> None:
        """A team of `size` seats (the activity's size when it opens)."""
        if len(self.team_ids) >= MAX_TEAMS:
            return
        tid = f"t{len(self.team_ids)}"
        self.run(self.harness.redis.hset(self.harness.keys.activity(AID), "team_size", size))
        reply = self.run(self.harness.open(tid, leader, f"o-{leader}"))
        if reply.code is TeamCode.OK:
            self.team_ids.append(tid)

    @rule(user=USER, team=PICK)
    def lock(self, user: str, team: int) -> None:
        """A lock of a named team, from anyone (a member, a holder, someone waiting)."""
        self._lock(user, self._team(team))

    @rule(user=USER)
    def join(self, user: str) -> None:
        """A join of any team, from anyone."""
        self._join(user)

    @rule(team=PICK, pick=PICK, holder=st.booleans())
    def unlock(self, team: int, pick: int, holder: bool) -> None:
        """A holder of a lock of the team gives it back (or anyone: mostly a no-op)."""
        tid = self._team(team)
        self.run(self.harness.unlock(tid, self._holder(tid, pick) if holder else USERS[pick]))

    @rule(team=PICK, pick=PICK)
    def confirm(self, team: int, pick: int) -> None:
        """A holder of a lock of the team pays for it (or someone without one is refused)."""
        tid = self._team(team)
        user = self._holder(tid, pick)
        self.run(self.harness.confirm(tid, user, f"o-{user}"))

    @rule(team=PICK, pick=PICK)
    def leave(self, team: int, pick: int) -> None:
        """A member of the team is refunded and leaves it, with the order they paid (never
        the last one: a team so abandoned fails, and its seats with it; deadlines fail some)."""
        tid = self._team(team)
        members = self._members(tid)
        if len(members) < 2:
            return
        user = sorted(members)[pick % len(members)]
        order = members[user].split("|")[2]
        self.run(self.harness.leave(tid, user, order, "refund"))

    @rule(user=USER, team=PICK)
    def queue_for_team(self, user: str, team: int) -> None:
        """Someone asks for a seat of a named team."""
        self._queue(user, self._team(team))

    @rule(user=USER)
    def queue_for_any_team(self, user: str) -> None:
        """Someone asks for a seat of any team."""
        self._queue(user, "")

    @rule(team=PICK, pick=PICK)
    def member_queues_for_any_team(self, team: int, pick: int) -> None:
        """A member of a team waits for a seat in any team: their join passes over their
        own team, so a seat free there sends them to queue anyway."""
        members = self._members(self._team(team))
        if not members:
            return
        self._queue(sorted(members)[pick % len(members)], "")

    def _queue(self, user: str, tid: str) -> None:
        """POST .../waitlist as the service runs it: a seat free now is locked (or joined),
        and a lock or join that finds none after all queues anyway (force)."""
        reply = self.run(self.harness.queue(user, tid))
        if reply.code is not TeamCode.TAKE_SEAT:
            return
        took = self._lock(user, tid) if tid else self._join(user)
        if took.code in NO_SEAT:
            self.run(self.harness.queue(user, tid, force=True))

    @rule(pick=PICK, waiting=st.booleans())
    def unqueue(self, pick: int, waiting: bool) -> None:
        """DELETE .../waitlist/{uid} by someone waiting (or anyone): it removes exactly a
        waiting entry, which ends so."""
        users = sorted(self.waiting) if waiting and self.waiting else USERS
        user = users[pick % len(users)]
        entry = self.run(self.harness.redis.hget(self.harness.keys.waitlist(AID), user))
        reply = self.run(self.harness.unqueue(user))
        was_waiting = entry is not None and entry.startswith("q|")
        assert bool(reply.removed) == was_waiting, (user, entry, reply)
        if was_waiting:
            self._end(user, int(entry.split("|")[4]), "removed")

    @rule()
    def expire_entries(self) -> None:
        """The lock sweep's waitlist pass: entries whose time ran out end."""
        self.run(self.harness.expire_entries())

    @rule(team=PICK)
    def sweep(self, team: int) -> None:
        """The lock sweep applies time to one team (its expired locks go to the lines)."""
        self.run(self.harness.sweep(self._team(team)))

    @rule(steps=st.integers(1, 3))
    def advance(self, steps: int) -> None:
        """Time passes: locks, offers and entries expire on a whole step."""
        self.harness.shift_ms += steps * STEP_MS

    # -- calls that take a seat -------------------------------------------------------

    def _lock(self, user: str, tid: str) -> TeamReply:
        """team_lock as the service calls it (naming the team of the lock it releases)."""
        other = ""
        for _ in range(SWITCH_ATTEMPTS):
            reply = self.run(self.harness.lock(tid, user, other))
            if reply.code is not TeamCode.SWITCH_NEEDED:
                break
            other = reply.team_id
        if reply.code is TeamCode.OK:
            self._check_no_line_passed_over(user, tid)
        return reply

    def _join(self, user: str) -> TeamReply:
        """team_join as the service calls it (further down the index while told to)."""
        cursor: tuple[Any, str] = ("", "")
        while True:
            reply = self.run(self.harness.join(user, cursor))
            if reply.code is not TeamCode.LOOK_FURTHER:
                break
            cursor = (reply.score, reply.team_id)
        if reply.code is TeamCode.OK:
            self._check_no_line_passed_over(user, reply.team_id)
        return reply

    def _check_no_line_passed_over(self, user: str, tid: str) -> None:
        """Property 1: a new lock taken outside the lines leaves nobody waiting who could
        have taken that seat: the team's line is empty, and whoever still waits for any team
        is a member of that team or left it (the caller's own entry counts too: it would
        still wait while its user holds a lock)."""
        redis, keys = self.harness.redis, self.harness.keys
        waiting = self.run(redis.zrange(self._line_key(tid), 0, -1))
        assert not waiting, f"{user} took a seat of {tid} while its line held {waiting}"
        members = self._members(tid)
        for other in self.run(redis.zrange(self._line_key(""), 0, -1)):
            left = self.run(redis.hexists(keys.team(AID, tid), f"left:{other}"))
            assert other in members or left, f"{user} took a seat of {tid} {other} could take"

    def _members(self, tid: str) -> dict[str, str]:
        """The team's members: user -> 'seq|joined_at_ms|order_id'."""
        return dict(self.run(self.harness.redis.hgetall(self.harness.keys.team_members(AID, tid))))

    def _holder(self, tid: str, pick: int) -> str:
        """A user holding a lock of the team (stored, live or not), else any user."""
        holders = self.run(self.harness.redis.zrange(self.harness.keys.team_locks(AID, tid), 0, -1))
        return str(holders[pick % len(holders)]) if holders else USERS[pick]

    def _end(self, user: str, seq: int, how: str) -> None:
        """Property 3: an entry ends once."""
        before = self.ended.get((user, seq))
        assert before is None, f"entry {(user, seq)} ended {before}, then {how}"
        self.ended[(user, seq)] = how

    # -- what must hold after every step ------------------------------------------------

    @invariant()
    def the_waitlist_keeps_its_guarantees(self) -> None:
        """Properties 2 to 5 (property 1 is checked right after each lock and join)."""
        if self.h is None:
            return
        self._read_new_records()
        lines = self._lines()
        self._check_arrival_order(lines)
        self._check_counts(lines)
        self._check_teams()
        self.waiting = lines

    def _read_new_records(self) -> None:
        """Properties 2 and 3 from the records this step wrote: each ending once, and each
        line's offers in rising seq (the line an entry waited in: as seen before the step)."""
        records = self.run(self.harness.records())
        for record in records[self.records_seen :]:
            how = ENDINGS.get(record["type"])
            if how is None:
                continue
            user, seq = record["user_id"], int(record["seq"])
            assert self.waiting.get(user, (None, ""))[0] == seq, (
                f"{record} ended an entry that was not waiting before this step: {self.waiting}"
            )
            line = self.waiting[user][1]
            if how == "offered":
                tid = record["team_id"]
                assert line in ("", tid), (record, line)  # a team's line: its seat
                ahead = [
                    u
                    for u, (s, at) in self.waiting.items()
                    if at == line and s < seq and (u, s) not in self.ended
                ]
                passed = [u for u in ahead if self._suits(u, tid)]
                assert not passed, f"line {line!r} offered seq {seq} of {tid} before {passed}"
                self.offered.setdefault(line, []).append((seq, tid))
            else:
                assert record["team_id"] == line, (record, line)
            self._end(user, seq, how)
        self.records_seen = len(records)

    def _lines(self) -> dict[str, tuple[int, str]]:
        """Every entry waiting in a line now: user -> (seq, line); each user in one line."""
        waiting: dict[str, tuple[int, str]] = {}
        for line in ["", *self.team_ids]:
            key = self._line_key(line)
            for user, score in self.run(self.harness.redis.zrange(key, 0, -1, withscores=True)):
                assert user not in waiting, f"{user} waits in {waiting[user][1]!r} and {line!r}"
                waiting[user] = (int(score), line)
        return waiting

    def _check_arrival_order(self, lines: dict[str, tuple[int, str]]) -> None:
        """Property 2 (no entry waits behind one its line offered) and the rest of 3 (an
        entry still waiting has not ended)."""
        for user, (seq, line) in lines.items():
            assert (user, seq) not in self.ended, (
                f"{user} (seq {seq}) waits in {line!r} but ended {self.ended[(user, seq)]}"
            )
            offers = self.offered.get(line, [])
            passed = [s for s, tid in offers if s > seq and self._suits(user, tid)]
            assert not passed, f"line {line!r} offered {passed} while {user} (seq {seq}) waits"

    def _suits(self, user: str, tid: str) -> bool:
        """Whether a seat of the team suits the user: not a member of it, never left it (an
        entry for any team is passed over for a team that does not suit it)."""
        keys = self.harness.keys
        left = self.run(self.harness.redis.hexists(keys.team(AID, tid), f"left:{user}"))
        return user not in self._members(tid) and not left

    def _check_counts(self, lines: dict[str, tuple[int, str]]) -> None:
        """Property 4, and each waiting entry's hash entry agrees with its line."""
        redis, keys = self.harness.redis, self.harness.keys
        entries = self.run(redis.hgetall(keys.waitlist(AID)))
        due = self.run(redis.zrange(keys.waitlist_due(AID), 0, -1))
        assert int(entries.get("~waiting", 0)) == len(lines), (entries, lines)
        assert sorted(due) == sorted(lines), (due, lines)
        for user, (seq, line) in lines.items():
            kind, team, _queued, _expires, entry_seq = entries[user].split("|")
            assert (kind, team, int(entry_seq)) == ("q", line, seq), (user, entries[user])

    def _check_teams(self) -> None:
        """Property 5: members and stored locks (live or not yet purged) fit every open team."""
        redis, keys = self.harness.redis, self.harness.keys
        for tid in self.team_ids:
            status, size = self.run(redis.hmget(keys.team(AID, tid), "status", "size"))
            if status != "open":
                continue
            members = self.run(redis.hlen(keys.team_members(AID, tid)))
            locks = self.run(redis.zcard(keys.team_locks(AID, tid)))
            assert members + locks <= int(size), (tid, members, locks, size)


SETTINGS = hypothesis_settings(max_examples=25, stateful_step_count=30, deadline=None)


def test_waitlist_on_fakeredis() -> None:
    """The five waitlist properties hold along random runs on fakeredis."""
    run_state_machine_as_test(WaitlistMachine, settings=SETTINGS)


@pytest.mark.real
def test_waitlist_on_a_real_server(real_redis_url: str) -> None:
    """The same runs on a real redis-server."""

    class OnRealServer(WaitlistMachine):
        redis_url = real_redis_url

    run_state_machine_as_test(OnRealServer, settings=SETTINGS)


# -- a bug the machine found, kept as a minimal example -----------------------------


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    """The scripts on this test's Redis, for an activity of teams of 2."""
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity(2)
    return harness


async def test_a_join_takes_no_seat_of_a_team_someone_waits_for(h: Harness) -> None:
    """Property 1 on the machine's shortest way there (SPEC §4.13). The leader L of the
    only team asks for a seat in any team: the join passes over L's own team, so the
    service queues L anyway (force) in the activity's line. X then asks for t0, whose seat
    is free: waitlist_join sees someone waiting (L, who can never take it) and queues X in
    t0's line. L leaves the line; Y joins: Y must not take the seat X waits for (the
    machine found Y taking it, while team_join passed over the teams' own lines)."""
    await h.open("t0", "L", "oL")
    assert (await h.queue("L")).code is TeamCode.TAKE_SEAT
    assert (await h.join("L")).code is TeamCode.NO_TEAM_AVAILABLE  # L's own team only
    assert (await h.queue("L", force=True)).code is TeamCode.QUEUED
    asked = await h.queue("X", "t0")
    assert (await h.unqueue("L")).removed
    joined = await h.join("Y")
    waiting = await h.redis.zrange(f"{h.keys.line(AID)}:t0", 0, -1)
    assert joined.code is not TeamCode.OK or not waiting, (asked, joined, waiting)
