"""The waitlist's scripts and hand-offs, on fakeredis and a real redis-server: who is offered
a freed seat (the team's line first, then the activity's, in arrival order), which paths
free one (an expiry, an unlock, a leave, a switch, a new team, a unit of stock coming back),
who is dropped on the way, and the refusals, which change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.scripts import TeamReply
from groupbuy.locks.waitlist import serve_line
from tests.support.team_scripts import AID, TTL_MS, Harness

QUEUED, OFFERED, OK = TeamCode.QUEUED, TeamCode.OFFERED, TeamCode.OK


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity(size=3)
    return harness


def code(reply: TeamReply, expected: TeamCode) -> TeamReply:
    assert reply.code is expected, reply
    return reply


async def full_team(h: Harness, tid: str, *lockers: str) -> None:
    """An open team (leader L-tid) whose other seats are `lockers`' locks."""
    code(await h.open(tid, f"L-{tid}"), OK)
    for user in lockers:
        code(await h.lock(tid, user), OK)


async def offered_to(h: Harness) -> list[tuple[str, str]]:
    """(user, team) of every lock.offered record, in order."""
    return [(r["user_id"], r["team_id"]) for r in await h.records() if r["type"] == "lock.offered"]


async def ended(h: Harness, kind: str) -> list[tuple[str, str]]:
    """(user, reason or '') of every record of `kind` (waitlist.dropped, waitlist.expired)."""
    return [(r["user_id"], r.get("reason", "")) for r in await h.records() if r["type"] == kind]


async def test_a_free_seat_is_taken_now_and_a_full_team_queues_in_order(h: Harness) -> None:
    """A free seat with nobody waiting: TAKE_SEAT (the service locks instead); a full team:
    QUEUED with the position, a repeat answers the same entry."""
    code(await h.open("t1", "L"), OK)
    code(await h.queue("w0", "t1"), TeamCode.TAKE_SEAT)
    await h.lock("t1", "u1")
    await h.lock("t1", "u2")
    first = code(await h.queue("w1", "t1"), QUEUED)
    second = code(await h.queue("w2", "t1"), QUEUED)
    assert (first.position, first.new, second.position, second.new) == (1, 1, 2, 1)
    again = code(await h.queue("w2", "t1"), QUEUED)
    assert (again.position, again.new, again.queued_at_ms) == (2, 0, second.queued_at_ms)
    read = code(await h.waiting("w2"), QUEUED)
    assert (read.position, read.team_id) == (2, "t1")
    code(await h.waiting("nobody"), TeamCode.NOT_WAITING)


async def test_each_freed_seat_goes_to_the_head_of_the_line(h: Harness) -> None:
    """An unlock, an expiry (found by a sweep) and a leave each offer their seat to the next
    in line; the offer is a real lock: GET answers it, the lock blocks outsiders."""
    await full_team(h, "t1", "u1", "u2")
    for user in ("w1", "w2", "w3"):
        code(await h.queue(user, "t1"), QUEUED)
    await h.unlock("t1", "u1")
    assert await offered_to(h) == [("w1", "t1")]
    offer = code(await h.waiting("w1"), OFFERED)
    assert offer.expires_at_ms - offer.locked_at_ms == TTL_MS
    assert code(await h.waiting("w2"), QUEUED).position == 1
    code(await h.lock("t1", "outsider"), TeamCode.TEAM_FULL)
    h.shift_ms += TTL_MS + 1  # u2's and w1's locks expire
    await h.sweep("t1")
    assert await offered_to(h) == [("w1", "t1"), ("w2", "t1"), ("w3", "t1")]
    code(await h.confirm("t1", "w2", "o2"), OK)  # an offer confirmed: it is taken
    joined = [r for r in await h.records() if r["type"] == "team.member_joined"]
    assert joined[-1]["offered"] == "1"
    code(await h.waiting("w2"), TeamCode.NOT_WAITING)


async def test_the_teams_line_goes_before_the_activitys(h: Harness) -> None:
    """A seat of t1 goes to t1's line first; once it is empty, to the line for any team."""
    await full_team(h, "t1", "u1", "u2")
    code(await h.queue("any1"), QUEUED)
    code(await h.queue("own1", "t1"), QUEUED)
    await h.unlock("t1", "u1")
    await h.unlock("t1", "u2")
    assert await offered_to(h) == [("own1", "t1"), ("any1", "t1")]


async def test_outsiders_wait_while_anyone_does(h: Harness) -> None:
    """While the line for any team is non-empty, a join finds no team, and a new team's
    free seats go to the line at once."""
    await full_team(h, "t1", "u1", "u2")
    code(await h.queue("any1"), QUEUED)
    code(await h.queue("any2"), QUEUED)
    code(await h.join("outsider"), TeamCode.NO_TEAM_AVAILABLE)
    code(await h.open("t2", "L2"), OK)  # two free seats: both waiting users get one
    assert await offered_to(h) == [("any1", "t2"), ("any2", "t2")]
    code(await h.join("outsider"), TeamCode.NO_TEAM_AVAILABLE)  # t2 is full of offers


async def test_a_switch_offers_the_seat_it_releases(h: Harness) -> None:
    """A user moving their lock to another team frees the old seat: the line gets it."""
    await full_team(h, "t1", "mover", "u2")
    code(await h.open("t2", "L2"), OK)
    code(await h.queue("w1", "t1"), QUEUED)
    code(await h.lock("t2", "mover", other="t1"), OK)
    assert await offered_to(h) == [("w1", "t1")]


async def test_users_who_cannot_take_the_seat_are_dropped_on_the_way(h: Harness) -> None:
    """A blocked user and a user past the team limit are dropped (one waitlist.dropped
    each, with the reason); the next fit user gets the seat."""
    await h.redis.hset(h.keys.activity(AID), "teams_per_user", 1)
    await full_team(h, "t1", "u1", "u2")
    for user in ("blocked", "capped", "fit"):
        code(await h.queue(user, "t1"), QUEUED)
    code(await h.open("t9", "capped"), OK)  # capped leads a team now: at the limit
    await h.redis.hset(h.keys.activity_blocklist(AID), "blocked", "1")
    await h.unlock("t1", "u1")
    assert await ended(h, "waitlist.dropped") == [("blocked", "blocked"), ("capped", "limit")]
    assert await offered_to(h) == [("fit", "t1")]


async def test_a_team_that_ends_drops_its_line(h: Harness) -> None:
    """Confirming the last seat forms the team: those waiting for it are dropped."""
    await full_team(h, "t1", "u1", "u2")
    code(await h.queue("w1", "t1"), QUEUED)
    await h.confirm("t1", "u1", "o1")
    await h.confirm("t1", "u2", "o2")
    assert await ended(h, "waitlist.dropped") == [("w1", "team_formed")]
    code(await h.waiting("w1"), TeamCode.NOT_WAITING)


async def test_a_unit_of_stock_coming_back_goes_to_the_line(h: Harness) -> None:
    """Sold out with free seats: the line waits for a unit; a refund in a formed team gives
    one back and the head of the line gets a seat of an open team."""
    await h.redis.hset(h.keys.activity(AID), "stock", 4)
    await full_team(h, "t1", "u1", "u2")
    await h.confirm("t1", "u1", "o1")
    await h.confirm("t1", "u2", "o2")  # t1 formed: 3 units held
    code(await h.open("t2", "L2"), OK)  # the 4th unit: t2 has 2 free seats, no unit left
    code(await h.lock("t2", "outsider"), TeamCode.ACTIVITY_SOLD_OUT)
    code(await h.queue("w1"), QUEUED)
    await h.leave("t1", "u1", "o1")  # refunded: its unit comes back
    assert await offered_to(h) == [("w1", "t2")]


async def test_entries_expire_once_and_leave_removes_them(h: Harness) -> None:
    """An entry past its lifetime ends with one waitlist.expired (by the sweep's pass, or
    at the head of the line); DELETE takes an entry out and answers whether it did."""
    await full_team(h, "t1", "u1", "u2")
    await h.redis.hset(h.keys.activity(AID), "waitlist_ttl_ms", 1000)
    code(await h.queue("w1", "t1"), QUEUED)
    code(await h.queue("w2"), QUEUED)
    code(await h.queue("gone", "t1"), QUEUED)
    assert (await h.unqueue("gone")).removed == 1
    assert (await h.unqueue("gone")).removed == 0
    h.shift_ms += 1001
    assert await h.expire_entries() == 2
    assert await h.expire_entries() == 0
    assert await ended(h, "waitlist.expired") == [("w1", ""), ("w2", "")]
    waitlist = await h.redis.hgetall(h.keys.waitlist(AID))
    assert waitlist.get("~waiting") == "0"
    assert not await h.redis.exists(h.keys.line(AID), h.keys.waitlist_due(AID))


async def test_refusals_change_nothing(h: Harness) -> None:
    """A user holding a lock may not queue; a full waitlist refuses; nothing is written."""
    await h.redis.hset(h.keys.activity(AID), "waitlist_max", 1)
    await full_team(h, "t1", "u1", "u2")
    assert code(await h.queue("u1", "t1"), TeamCode.ALREADY_LOCKED).team_id == "t1"
    code(await h.queue("w1", "t1"), QUEUED)
    before = await h.records()
    assert code(await h.queue("w2", "t1"), TeamCode.WAITLIST_FULL).max_len == 1
    code(await h.queue("x", "nope"), TeamCode.TEAM_NOT_FOUND)
    assert await h.records() == before
    assert await h.redis.zcard(h.keys.line(AID) + ":t1") == 1


async def test_a_raised_stock_serves_the_line(h: Harness) -> None:
    """Units a raise of the stock gives go to the line for any team, in order, as far as
    seats and units allow (waitlist_serve, which the PATCH calls)."""
    await h.redis.hset(h.keys.activity(AID), "stock", 1)
    code(await h.open("t1", "L1"), OK)  # the one unit: t1 has 2 free seats, none sellable
    for user in ("w1", "w2", "w3"):
        code(await h.queue(user), QUEUED)
    await h.redis.hset(h.keys.activity(AID), "stock", 3)
    assert await serve_line(h.teams, AID) == 2
    assert await offered_to(h) == [("w1", "t1"), ("w2", "t1")]
    assert code(await h.waiting("w3"), QUEUED).position == 1


async def test_an_offer_released_or_moved_is_no_longer_answered(h: Harness) -> None:
    """An offer its user released reads as nothing, and queueing again makes a new entry;
    the seat went back to the line (the next in line got it)."""
    await full_team(h, "t1", "u1", "u2")
    code(await h.queue("w1", "t1"), QUEUED)
    code(await h.queue("w2", "t1"), QUEUED)
    await h.unlock("t1", "u1")
    code(await h.waiting("w1"), OFFERED)
    await h.unlock("t1", "w1")  # w1 lets the offer go: w2 is next
    code(await h.waiting("w1"), TeamCode.NOT_WAITING)
    assert await offered_to(h) == [("w1", "t1"), ("w2", "t1")]
    again = code(await h.queue("w1", "t1"), QUEUED)
    assert (again.position, again.new) == (1, 1)


async def test_a_seat_the_stock_held_back_goes_to_its_line_not_to_a_lock(h: Harness) -> None:
    """Sold out, t2's free seats wait for units with its line; when a unit comes back (a
    raise here), a lock or a join from outside hands the seat to the line instead."""
    await h.redis.hset(h.keys.activity(AID), "stock", 4)
    await full_team(h, "t1", "u1", "u2")  # 3 units
    code(await h.open("t2", "L2"), OK)  # the 4th: t2 has 2 free seats and no unit
    code(await h.queue("w1", "t2"), QUEUED)
    code(await h.queue("w2", "t2"), QUEUED)
    await h.redis.hset(h.keys.activity(AID), "stock", 5)  # a unit, nothing offered yet
    code(await h.lock("t2", "outsider"), TeamCode.ACTIVITY_SOLD_OUT)
    assert await offered_to(h) == [("w1", "t2")]
    await h.redis.hset(h.keys.activity(AID), "stock", 6)
    code(await h.join("outsider"), TeamCode.ACTIVITY_SOLD_OUT)
    assert await offered_to(h) == [("w1", "t2"), ("w2", "t2")]
