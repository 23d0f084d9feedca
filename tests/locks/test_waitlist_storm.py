"""A waitlist storm on `groupbuy serve` over a real redis-server (SPEC §3 "Waitlist", §4.13):
300 shoppers on 50 teams of 3 with 1 s locks and 1 s offers. Half wait in line (for a named
team or for any team), read their entry until it is offered, then confirm, release or let
the offer run out, and queue again; the other half retry seat locks and joins as fast as
they can. Once every entry has run out, the durable events feed and the answers the
shoppers were given must show: each offer went to the head of its line, in arrival order;
no entry was offered twice; every entry ended exactly once (offered, removed, dropped or
expired); no lock from outside the lines was taken while someone certainly waited for a
seat of that team; and no seat an expired lock freed was passed over while someone did.

An entry is the 202 of a POST .../waitlist, told apart by its user and `queued_at` (what its
events carry). Times compared are Redis's clock as answers and events carry it (ms), except
for a removal: when its DELETE was sent, by the test's clock (the same host's wall clock).
The shoppers call over aiohttp, as groupbuy_client.client does: with httpx's pool the test process
alone filled both cores at a few hundred calls a second, and a 1 s lock ran out before its
confirm was answered."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from groupbuy_client.wire import iso_ms

from tests.support.http import ADMIN, SERVICE, ms
from tests.support.service import service_environment, start_service

pytestmark = [pytest.mark.slow, pytest.mark.real]

ACTIVITY = "wl"
TEAMS = 50
TEAM_SIZE = 3  # the leader is a member: 2 free seats a team, 100 in all
SHOPPERS = 300
QUEUERS = SHOPPERS // 2  # the first half wait in line, the rest lock directly
LOCK_TTL_S = 1  # a seat lock's lifetime, and an offer's
ENTRY_TTL_S = 3  # an entry still waiting when the storm ends is gone this soon after
STORM_S = 10.0  # no call starts after this
CALLS_PER_SHOPPER = 60  # each shopper's most calls: bounds the storm's load on 2 cores
POLL_S = 0.25  # between a waiting shopper's reads of its entry (an offer lasts 1 s)
JOIN_SHARE = 0.5  # of a direct locker's tries, joins of any team (the rest: a random team)
# Past a lock's expiry ms by this much, Redis's clock (the same host's) has passed it too.
PAST_EXPIRY_S = 0.005
# A shopper pauses this long before queueing again, as a person would; it also keeps the
# new entry's queued_at apart from the last one's, which is how an entry is told apart.
THINK_S = (0.02, 0.08)
CONFIRM_SHARE = 0.06  # of the locks a shopper gets, the part paid for (the shopper is done)
UNLOCK_SHARE = 0.4  # the part released at once; the rest run out
LEAVE_SHARE = 0.08  # the chance, at each read, that a waiting shopper leaves the line
REQUEUE_SHARE = 0.9  # the chance that a shopper whose turn ended queues again
NAMED_SHARE = 0.5  # of the waiting shoppers, those who name a team (the rest: any team)
# Those who name a team pick one of the first few (the ones everyone wants): lines long
# enough that some entries wait out their ENTRY_TTL_S, or are dropped when their team forms.
HOT_TEAMS = 8
SETTLE_S = 15.0  # the most the expiries and the write-behind may take after the storm
SETTLE_POLL_S = 0.1  # between sweeps (and write-behind runs) while settling
PAGE = 1000  # the events feed's largest page

# Every answer the storm may get, by call: anything else (a 5xx, a 422) fails the test.
EXPECTED = {
    "queue": {"201", "200", "202", "409 team_formed", "409 conflict"},
    "read": {"200", "404 not_waiting"},
    "leave": {"200"},
    "lock": {"201", "200", "409 team_full", "409 team_formed"},
    "join": {"201", "200", "409 no_team_available"},
    # A lock can run out while its confirm waits for the server, and others fill the team.
    "confirm": {"201", "409 lock_required", "409 team_formed"},
    "unlock": {"200"},
    "setup": {"201"},
}


@dataclass
class Entry:
    """A place in line as the shopper was told it (202): the team named ('' any team), when
    it queued and expires (server ms), and when the DELETE that removed it was sent."""

    user: str
    team: str
    queued_at: str
    queued_ms: int
    expires_ms: int
    removed_ms: int | None = None  # floor of the test's clock when the DELETE was sent

    @classmethod
    def told(cls, user: str, team: str, queued: dict[str, Any]) -> Entry:
        """The entry a 202 answer describes."""
        at = queued["queued_at"]
        return cls(user, team, at, ms(at), ms(queued["expires_at"]))

    @property
    def key(self) -> tuple[str, str]:
        """What the entry's events carry: the user and queued_at."""
        return self.user, self.queued_at


@dataclass
class Seat:
    """A new lock from outside the lines (201 from a lock, a join or the waitlist's POST)
    and the team's version after it."""

    user: str
    team: str
    locked_ms: int
    version: int
    via: str

    @classmethod
    def told(cls, user: str, lock: dict[str, Any], via: str) -> Seat:
        """The seat a 201 answer describes."""
        return cls(user, lock["team_id"], ms(lock["locked_at"]), lock["version"], via)


@dataclass
class Storm:
    """What the shoppers share: the service, the answers, and what they were told."""

    session: aiohttp.ClientSession
    stop_at: float
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    entries: list[Entry] = field(default_factory=list)
    seats: list[Seat] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)
    formed: set[str] = field(default_factory=set)

    def running(self) -> bool:
        """Whether calls may still start."""
        return time.monotonic() < self.stop_at

    async def call(
        self, what: str, method: str, path: str, body: Any = None, headers: Any = SERVICE
    ) -> Answer:
        """Make the call and count its answer under `what`."""
        async with self.session.request(method, path, json=body, headers=headers) as response:
            text = await response.text()
        try:
            answer = Answer(response.status, json.loads(text))
        except ValueError:
            answer = Answer(response.status, {"code": "non-json", "text": text})
        self.answers[(what, answer.kind)] += 1
        return answer


@dataclass(frozen=True)
class Answer:
    """A response's status and JSON body."""

    status: int
    body: Any

    @property
    def kind(self) -> str:
        """The status, with the problem's code for a 4xx or 5xx."""
        return str(self.status) if self.status < 400 else f"{self.status} {self.body.get('code')}"


@dataclass
class Shopper:
    """One user with a budget of calls; every call counts against it."""

    storm: Storm
    user: str
    rng: random.Random
    calls_left: int = CALLS_PER_SHOPPER

    def may_call(self) -> bool:
        """Whether the shopper has calls left and the storm still runs."""
        return self.calls_left > 0 and self.storm.running()

    async def call(self, what: str, method: str, path: str, body: Any = None) -> Answer:
        """One call of the shopper's budget."""
        self.calls_left -= 1
        return await self.storm.call(what, method, path, body)

    def free_team(self, among: int = TEAMS) -> str | None:
        """One of the first `among` teams not known to be formed, at random."""
        teams = [f"t{n}" for n in range(among) if f"t{n}" not in self.storm.formed]
        return self.rng.choice(teams) if teams else None


async def _until(expires_at: str) -> None:
    """Let a lock run out: wait past its expiry (Redis's ms; the same host's clock)."""
    await asyncio.sleep(max(0.0, ms(expires_at) / 1000 - time.time()) + PAST_EXPIRY_S)


async def _use_lock(shopper: Shopper, lock: dict[str, Any], what: str) -> bool:
    """Pay for the lock, release it or let it run out; whether the shopper became a member."""
    if not shopper.may_call():
        return False  # the storm is over: the lock runs out by itself
    storm, team = shopper.storm, lock["team_id"]
    path = f"/v1/activities/{ACTIVITY}/teams/{team}"
    roll = shopper.rng.random()
    if roll < CONFIRM_SHARE:
        body = {"user_id": shopper.user, "order_id": f"o-{shopper.user}"}
        confirmed = await shopper.call("confirm", "POST", f"{path}/members", body)
        if confirmed.status == 201:
            storm.done[f"{what} confirmed"] += 1
            if confirmed.body["formed"]:
                storm.formed.add(team)
            return True
        storm.done[f"{what} confirm too late"] += 1
    elif roll < CONFIRM_SHARE + UNLOCK_SHARE:
        await shopper.call("unlock", "DELETE", f"{path}/locks/{shopper.user}")
        storm.done[f"{what} unlocked"] += 1
    else:
        storm.done[f"{what} left to expire"] += 1
        await _until(lock["expires_at"])
    return False


async def _locker(shopper: Shopper) -> None:
    """Retry a lock on a random team, or a join of any team, until one holds; use it; again
    until the shopper is a member."""
    storm = shopper.storm
    while shopper.may_call():
        team = shopper.free_team()
        if team is None:
            return
        if shopper.rng.random() < JOIN_SHARE:
            what, path = "join", f"/v1/activities/{ACTIVITY}/locks"
        else:
            what, path = "lock", f"/v1/activities/{ACTIVITY}/teams/{team}/locks"
        answer = await shopper.call(what, "POST", path, {"user_id": shopper.user})
        if answer.kind == "409 team_formed":
            storm.formed.add(team)
        if answer.status != 201:
            continue
        lock = answer.body
        storm.seats.append(Seat.told(shopper.user, lock, what))
        if await _use_lock(shopper, lock, what):
            return


async def _wait_in_line(shopper: Shopper, entry: Entry) -> dict[str, Any] | None:
    """Read the entry until it is offered (the offer) or gone (None); leave the line now and
    then. A shopper out of calls walks away: the entry runs out by itself."""
    path = f"/v1/activities/{ACTIVITY}/waitlist/{shopper.user}"
    while shopper.may_call():
        await asyncio.sleep(POLL_S)
        if shopper.rng.random() < LEAVE_SHARE and shopper.may_call():
            sent_ms = math.floor(time.time() * 1000)
            left = await shopper.call("leave", "DELETE", path)
            if left.body["removed"]:
                entry.removed_ms = sent_ms
                return None
            continue  # offered or ended meanwhile: the next read says which
        read = await shopper.call("read", "GET", path)
        if read.status == 404:
            return None
        if read.body["status"] == "offered":
            return dict(read.body)
    return None


async def _queue_once(shopper: Shopper, named: bool) -> dict[str, Any] | None:
    """One turn in line: queue (for a team or any team) and wait; the lock the POST or the
    line gave, if any."""
    storm = shopper.storm
    body = {"user_id": shopper.user}
    if named:
        team = shopper.free_team(HOT_TEAMS)
        if team is None:
            return None
        body["team_id"] = team
    answer = await shopper.call("queue", "POST", f"/v1/activities/{ACTIVITY}/waitlist", body)
    if answer.status == 201:  # a seat was free and nobody waited: a lock from outside a line
        lock = answer.body
        storm.seats.append(Seat.told(shopper.user, lock, "queue"))
        return dict(lock)
    if answer.status == 202:
        entry = Entry.told(shopper.user, body.get("team_id", ""), answer.body)
        storm.entries.append(entry)
        offer = await _wait_in_line(shopper, entry)
        storm.done["offers seen" if offer else "waits ended with no offer seen"] += 1
        return offer
    if answer.status == 200 and answer.body["status"] == "offered":
        # The line's offer, still this shopper's lock: made by this very call when a seat
        # came free as the entry queued (an entry the shopper learns of by its offer).
        offer = answer.body
        key = (shopper.user, offer["queued_at"])
        if key not in {entry.key for entry in storm.entries}:
            queued = {
                "queued_at": offer["queued_at"],
                "expires_at": iso_ms(ms(offer["queued_at"]) + ENTRY_TTL_S * 1000),
            }
            storm.entries.append(Entry.told(shopper.user, body.get("team_id", ""), queued))
        storm.done["queue answered an offer"] += 1
        return dict(offer)
    if answer.kind == "409 team_formed":
        storm.formed.add(body["team_id"])
    return None


async def _queuer(shopper: Shopper, named: bool) -> None:
    """Turns in line, each lock got used, until the shopper is a member, gives up or is out
    of calls or time."""
    while shopper.may_call():
        lock = await _queue_once(shopper, named)
        if lock is not None:
            what = "offer" if lock["status"] == "offered" else "queue"
            if await _use_lock(shopper, lock, what):
                return
        if shopper.rng.random() > REQUEUE_SHARE:
            return
        await asyncio.sleep(shopper.rng.uniform(*THINK_S))


async def _open_teams(storm: Storm) -> None:
    """The activity (1 s locks and offers, entries of ENTRY_TTL_S) and every team, first."""
    body = {
        "activity_id": ACTIVITY,
        "team_size": TEAM_SIZE,
        "lock_ttl_s": LOCK_TTL_S,
        "waitlist": {"ttl_s": ENTRY_TTL_S, "offer_ttl_s": LOCK_TTL_S},
    }
    created = await storm.call("setup", "POST", "/v1/activities", body, ADMIN)
    assert created.status == 201, created
    for n in range(TEAMS):
        team = {"leader_id": f"L{n}", "team_id": f"t{n}"}
        opened = await storm.call("setup", "POST", f"/v1/activities/{ACTIVITY}/teams", team)
        assert opened.status == 201, opened


async def _settle(storm: Storm) -> None:
    """Past the last entry's expiry, sweep until nobody waits and no lock lives (the
    scheduler sweeps too), then run the write-behind until nothing waits."""
    last_ms = max((entry.expires_ms for entry in storm.entries), default=0)
    await asyncio.sleep(max(0.0, last_ms / 1000 - time.time()))
    deadline = time.monotonic() + SETTLE_S
    while True:
        swept = await storm.call("admin", "POST", "/v1/admin/jobs/sweep_locks/run", None, ADMIN)
        assert swept.status == 200, swept
        activity = await storm.call("admin", "GET", f"/v1/activities/{ACTIVITY}")
        if activity.body["waiting"] == 0 and activity.body["live_locks"] == 0:
            break
        assert time.monotonic() < deadline, activity
        await asyncio.sleep(SETTLE_POLL_S)
    while True:
        flushed = await storm.call("admin", "POST", "/v1/admin/jobs/flush_records/run", None, ADMIN)
        assert flushed.status == 200, flushed
        if flushed.body["backlog"] == 0:
            return
        assert time.monotonic() < deadline, flushed
        await asyncio.sleep(SETTLE_POLL_S)


async def _events(storm: Storm) -> list[dict[str, Any]]:
    """The activity's events from the durable feed, page by page, in feed order."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await storm.call("admin", "GET", f"/v1/events?after={after}&limit={PAGE}")
        assert page.status == 200, page
        if not page.body["events"]:
            return [e for e in events if e["data"].get("activity_id") == ACTIVITY]
        events.extend(page.body["events"])
        after = page.body["next_after"]


async def _run(url: str) -> tuple[Storm, list[dict[str, Any]], dict[str, float]]:
    """Open the teams, run the shoppers, settle; the storm, the events and the durations."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
        storm = Storm(session, stop_at=math.inf)
        await _open_teams(storm)
        rng = random.Random(1301)
        shoppers = [Shopper(storm, f"u{n}", random.Random(rng.random())) for n in range(SHOPPERS)]
        started = time.monotonic()
        storm.stop_at = started + STORM_S
        await asyncio.gather(
            *(_queuer(s, s.rng.random() < NAMED_SHARE) for s in shoppers[:QUEUERS]),
            *(_locker(s) for s in shoppers[QUEUERS:]),
        )
        stormed = time.monotonic()
        await _settle(storm)
        settled = time.monotonic()
        events = await _events(storm)
    return storm, events, {"storm_s": stormed - started, "settle_s": settled - stormed}


# -- the checks: each returns what it found wrong ------------------------------------------

ENDINGS = ("lock.offered", "waitlist.dropped", "waitlist.expired")
Key = tuple[str, str]


@dataclass
class Ends:
    """How each entry ended, from its events and its removal: (kind, server ms) each, and
    the ending events of no entry a shopper was told of."""

    of: dict[Key, list[tuple[str, int]]]
    strays: list[str]

    @classmethod
    def read(cls, entries: list[Entry], events: list[dict[str, Any]]) -> Ends:
        """The endings of the entries the shoppers were told of, in the feed's events."""
        ends = cls({entry.key: [] for entry in entries}, [])
        for entry in entries:
            if entry.removed_ms is not None:
                ends.of[entry.key].append(("removed", entry.removed_ms))
        for event in events:
            if event["type"] not in ENDINGS:
                continue
            data = event["data"]
            # An offer ends the entry when its lock begins; an expiry's `at` is the entry's
            # expiry, a drop's when it was dropped.
            at = ms(data["locked_at"] if event["type"] == "lock.offered" else event["at"])
            found = ends.of.get((data["user_id"], data["queued_at"]))
            if found is None:
                ends.strays.append(f"{event['type']} of no entry a shopper was told of: {event}")
            else:
                found.append((event["type"], at))
        return ends

    def until(self, entry: Entry) -> int:
        """The server ms before which the entry certainly still waited."""
        return min((at for _, at in self.of[entry.key]), default=entry.expires_ms)

    def offers(self, entry: Entry) -> list[int]:
        """When the entry was offered a seat (once at most)."""
        return [at for kind, at in self.of[entry.key] if kind == "lock.offered"]


def _by_line(entries: list[Entry]) -> dict[str, list[Entry]]:
    """The entries of each line: a team's, or '' for the any-team line."""
    lines: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        lines[entry.team].append(entry)
    return lines


def _ended_once(entries: list[Entry], ends: Ends, events: list[dict[str, Any]]) -> list[str]:
    """Every entry is told apart and ended exactly once (offered at most once), its events
    naming its line (an offer of a team's line: a seat of that team)."""
    wrong = [f"two entries {key}" for key, n in Counter(e.key for e in entries).items() if n > 1]
    for key, endings in ends.of.items():
        offers = sum(kind == "lock.offered" for kind, _ in endings)
        if offers > 1:
            wrong.append(f"entry {key} offered {offers} times")
        if len(endings) != 1:
            wrong.append(f"entry {key} ended {len(endings)} times: {endings}")
    lines = {entry.key: entry.team for entry in entries}
    for event in events:
        key = (event["data"].get("user_id"), event["data"].get("queued_at"))
        if event["type"] not in ENDINGS or key not in lines:
            continue
        line, team = lines[key], event["data"]["team_id"]
        if event["type"] == "lock.offered" and line and team != line:
            wrong.append(f"entry {key} of team {line}'s line offered a seat in {team}")
        if event["type"] != "lock.offered" and team != (line or None):
            wrong.append(f"entry {key} of line {line!r} ended as {event}")
    return wrong


def _offers_in_order(entries: list[Entry], ends: Ends) -> list[str]:
    """Within each line, offers in queue order (queued_at never goes down)."""
    wrong = []
    for line, waiting in _by_line(entries).items():
        made = sorted((at, e.queued_ms, e.user) for e in waiting for at in ends.offers(e))
        for (at1, queued1, user1), (at2, queued2, user2) in zip(made, made[1:], strict=False):
            if queued2 < queued1:
                wrong.append(
                    f"line {line!r}: {user2} (queued {queued2}) offered at {at2}, after "
                    f"{user1} (queued {queued1}) at {at1}"
                )
    return wrong


def _offers_went_to_heads(entries: list[Entry], ends: Ends) -> list[str]:
    """Each offer went to a live entry with nobody who queued earlier (by a ms at least)
    still waiting in its line."""
    wrong = []
    for waiting in _by_line(entries).values():
        for entry in waiting:
            for at in ends.offers(entry):
                if at >= entry.expires_ms:
                    wrong.append(f"{entry} offered at {at}, after it expired")
                ahead = [
                    f.user for f in waiting if f.queued_ms < entry.queued_ms and ends.until(f) > at
                ]
                if ahead:
                    wrong.append(f"{entry} offered at {at} while {ahead} waited ahead of it")
    return wrong


def _no_outsider_while_waiting(seats: list[Seat], entries: list[Entry], ends: Ends) -> list[str]:
    """No lock from outside the lines was taken in a team while someone certainly waited in
    its line or the any-team line (queued a ms or more before the lock, and still waiting a
    ms or more after it)."""
    lines = _by_line(entries)
    wrong = []
    for seat in seats:
        waiting = [
            f"{f.user}@{f.team or '*'}"
            for f in (*lines[seat.team], *lines[""])
            if f.queued_ms < seat.locked_ms < ends.until(f)
        ]
        if waiting:
            wrong.append(f"{seat} locked while {waiting} waited")
    return wrong


def _freed_seats_went_to_lines(
    events: list[dict[str, Any]], seats: list[Seat], entries: list[Entry], ends: Ends
) -> list[str]:
    """A seat freed by an expired lock went to the lines if anyone waited for it: the script
    that purges a lock offers its seat at once. So when a team's next change after a
    lock.expired (by the team's version) is neither an offer nor another expiry, nobody
    waited in its line or the any-team line from before the expiry until after that change.
    (Unlocks carry no version: a change after one is not looked at.)"""
    changes: dict[tuple[str, int], tuple[str, int]] = {}  # (team, version) -> (kind, ms)
    for event in events:
        data = event["data"]
        if data.get("version") is not None:
            changes[(data["team_id"], data["version"])] = (event["type"], ms(event["at"]))
    for seat in seats:
        changes[(seat.team, seat.version)] = ("lock", seat.locked_ms)
    lines = _by_line(entries)
    wrong = []
    for (team, version), (kind, freed) in changes.items():
        after = changes.get((team, version + 1))
        if kind != "lock.expired" or after is None or after[0] in ("lock.expired", "lock.offered"):
            continue
        waiting = [
            f"{f.user}@{f.team or '*'}"
            for f in (*lines[team], *lines[""])
            if f.queued_ms < freed and ends.until(f) > after[1]
        ]
        if waiting:
            wrong.append(
                f"{team}'s seat freed at {freed} (version {version}), then {after}, while "
                f"{waiting} waited"
            )
    return wrong


def test_lines_take_freed_seats_in_order_and_every_entry_ends_once(
    tmp_path: Path, real_redis_url: str
) -> None:
    """Under a storm of queuers and direct lockers, the feed and the answers show offers in
    arrival order to each line's head, one per entry, every entry ended exactly once, and no
    lock from outside a line while it certainly had someone waiting."""
    with redis.Redis.from_url(real_redis_url) as sync_client:
        sync_client.flushall()
    env = service_environment(
        tmp_path,
        GROUPBUY_REDIS_URL=real_redis_url,
        GROUPBUY_RATELIMIT_ENABLED="false",
        GROUPBUY_SCHEDULER_SWEEP_INTERVAL_S="0.2",  # expired locks freed (and offered) soon
        GROUPBUY_OUTBOX_FLUSH_INTERVAL_S="0.2",
    )
    service = start_service(tmp_path, env=env)
    try:
        storm, events, durations = asyncio.run(_run(service.url))
    finally:
        assert service.stop() == 0, service.text()[-3000:]

    unexpected = {
        (what, answer): n
        for (what, answer), n in storm.answers.items()
        if answer not in EXPECTED.get(what, {"200"})
    }
    kinds = Counter(event["type"] for event in events)
    drops = Counter(e["data"]["reason"] for e in events if e["type"] == "waitlist.dropped")
    ends = Ends.read(storm.entries, events)
    removed = sum(entry.removed_ms is not None for entry in storm.entries)
    print(
        f"\n[figures] waitlist storm: {SHOPPERS} shoppers, {TEAMS} teams of {TEAM_SIZE}; "
        f"{sum(storm.answers.values())} requests in {durations['storm_s']:.1f} s of storm, "
        f"{durations['settle_s']:.1f} s to settle; answers {dict(sorted(storm.answers.items()))}"
        f"\n[figures] {len(storm.entries)} entries "
        f"({sum(not e.team for e in storm.entries)} for any team); {len(storm.seats)} locks "
        f"from outside the lines {dict(Counter(s.via for s in storm.seats))}; "
        f"{kinds['lock.offered']} offers, {removed} removed, {kinds['waitlist.dropped']} "
        f"dropped {dict(drops)}, {kinds['waitlist.expired']} expired, "
        f"{kinds['lock.expired']} locks expired, {kinds['team.formed']} teams formed"
        f"\n[figures] shoppers: {dict(sorted(storm.done.items()))}"
    )
    assert not unexpected, unexpected
    assert not ends.strays, ends.strays[:5]
    # Every way in and out of a line was taken (drops need a team to form while its line
    # waits: most runs, not all).
    taken = (len(storm.entries), len(storm.seats), kinds["lock.offered"], removed)
    assert all(taken) and kinds["waitlist.expired"], "the storm left a path untried"
    for check in (
        _ended_once(storm.entries, ends, events),
        _offers_in_order(storm.entries, ends),
        _offers_went_to_heads(storm.entries, ends),
        _no_outsider_while_waiting(storm.seats, storm.entries, ends),
        _freed_seats_went_to_lines(events, storm.seats, storm.entries, ends),
    ):
        assert not check, (len(check), check[:5])
