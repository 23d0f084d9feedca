"""Property-based tests of seat locking (SPEC §1.1, §3 Teams and Joining any team, §4
guarantees 1, 2 and 8).

A hypothesis state machine drives the team engine on fakeredis and checks every answer
against a small Python model of what SPEC says must be true; after every step it
reads every team and every user's current lock back and checks the guarantees, and
checks the activity's open-seat index against a recomputation from the teams' own keys.

Redis's clock is frozen for the whole run (see `frozen_redis_clock`): the scripts'
time then moves only through `RedisClock.advance`, so whether a lock has expired is
decided by the drawn steps, never by how fast the machine running the test is.

Each run has a new fakeredis and a new SQLite file: its subject is the scripts' decisions,
and PostgreSQL runs with the real Redis only (tests/conftest.py), where the seat races
(tests/locks/test_concurrency.py, test_join.py) check the same guarantees on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from groupbuy_client.wire import Team, iso_ms
from hypothesis import event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from groupbuy import errors
from tests.support.engine_stack import EngineStack
from tests.support.seats import indexed_open_seats, recomputed_open_seats

T = TypeVar("T")

ACTIVITY = "props"
LOCK_TTL_S = 10
TEAM_DEADLINE_S = 60
ORDERS = ("o1", "o2")
MAX_USERS = 6
MAX_TEAMS = 4

# An answer, normalized so the service's and the model's can be compared with ==:
# ("ok", created, body) for a success, ("error", code, extra) for a GroupBuyError.
Answer = tuple[Any, ...]


# -- harness ------------------------------------------------------------------------


def _answer(stack: EngineStack, coro: Awaitable[Any]) -> Answer:
    """Run one service call and normalize what it answered."""
    try:
        outcome = stack.run(coro)
    except errors.GroupBuyError as exc:
        return ("error", exc.code, exc.extra)
    if isinstance(outcome, bool):  # unlock
        return ("ok", outcome)
    if isinstance(outcome, dict):  # current_lock
        return ("ok", outcome)
    return ("ok", outcome.created, outcome.body)


def _label(answer: Answer) -> str:
    """A short name for an answer, for hypothesis's statistics (--hypothesis-show-statistics)."""
    if answer[0] == "error":
        return str(answer[1])
    if len(answer) == 2:
        return f"released={answer[1]}"
    body = answer[2]
    if "formed" in body:
        return "formed" if body["formed"] else ("joined" if answer[1] else "joined (repeat)")
    if not answer[1]:
        return "existing"
    return "locked, switched" if body["released_team_id"] else "locked"


# -- the model ----------------------------------------------------------------------


@dataclass
class _TeamModel:
    team_id: str
    leader_id: str
    created_ms: int
    deadline_ms: int
    status: str = "open"
    # user -> (order_id, joined_at_ms), in joining order
    members: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    locks: dict[str, int] = field(default_factory=dict)  # user -> locked_at_ms
    formed_ms: int | None = None
    failed_ms: int | None = None
    version: int = 1  # +1 per lock, unlock, lock expiry, member, formed, failed
    formed_by: str | None = None


class _Model:
    """What SPEC says the activity looks like; time's effects are applied eagerly."""

    def __init__(self, size: int, now_ms: int) -> None:
        self.size = size
        self.ttl_ms = LOCK_TTL_S * 1000
        self.now_ms = now_ms
        self.teams: dict[str, _TeamModel] = {}

    def live(self, locked_at: int, at: int) -> bool:
        return locked_at + self.ttl_ms > at

    def open(self, team_id: str, leader_id: str) -> None:
        team = _TeamModel(team_id, leader_id, self.now_ms, self.now_ms + TEAM_DEADLINE_S * 1000)
        team.members[leader_id] = (None, self.now_ms)
        self.teams[team_id] = team

    def settle(self) -> None:
        """A team past its deadline has failed (at the deadline); expired locks are gone."""
        for team in self.teams.values():
            if team.status != "open":
                continue
            at = min(self.now_ms, team.deadline_ms)
            live = {u: a for u, a in team.locks.items() if self.live(a, at)}
            team.version += len(team.locks) - len(live)  # each expiry is a change
            team.locks = live
            if self.now_ms >= team.deadline_ms:
                team.status, team.failed_ms = "failed", team.deadline_ms
                team.version += 1
                team.locks.clear()  # live at the deadline: they end with the team

    def holders(self) -> list[tuple[str, str]]:
        """(user, team) of every lock the model holds, including ones time has ended unseen."""
        return sorted((user, t.team_id) for t in self.teams.values() for user in t.locks)

    def live_lock(self, user: str) -> tuple[str, int] | None:
        held = [(t.team_id, t.locks[user]) for t in self.teams.values() if user in t.locks]
        assert len(held) <= 1, f"model bug: {user} holds {held}"
        return held[0] if held else None

    def team_body(self, team_id: str) -> dict[str, Any]:
        """The team exactly as ActivityService.get_team must report it."""
        t = self.teams[team_id]
        locks = sorted((at, user) for user, at in t.locks.items())
        return {
            "activity_id": ACTIVITY,
            "team_id": team_id,
            "leader_id": t.leader_id,
            "status": t.status,
            "size": self.size,
            "members": [
                {"user_id": user, "order_id": order, "joined_at": iso_ms(joined)}
                for user, (order, joined) in t.members.items()
            ],
            "locks": [
                {"user_id": user, "locked_at": iso_ms(at), "expires_at": iso_ms(at + self.ttl_ms)}
                for at, user in locks
            ],
            "free_seats": self.size - len(t.members) - len(t.locks) if t.status == "open" else 0,
            "next_unlock_at": iso_ms(locks[0][0] + self.ttl_ms) if locks else None,
            "deadline_at": iso_ms(t.deadline_ms),
            "formed_at": iso_ms(t.formed_ms),
            "failed_at": iso_ms(t.failed_ms),
            "virtual_seats": 0,  # this activity has no virtual completion
            "version": t.version,
        }

    def _lock_body(self, user: str, team_id: str, at: int, released: str | None) -> dict[str, Any]:
        return {
            "status": "locked",
            "user_id": user,
            "team_id": team_id,
            "locked_at": iso_ms(at),
            "expires_at": iso_ms(at + self.ttl_ms),
            "released_team_id": released,
            "version": self.teams[team_id].version,
        }

    def lock(self, user: str, team_id: str) -> Answer:
        self.settle()
        t = self.teams[team_id]
        if user in t.members:
            return ("error", "already_member", {})
        if t.status == "formed":
            return ("error", "team_formed", {})
        if t.status == "failed":
            return ("error", "team_failed", {})
        if user in t.locks:
            body = self._lock_body(user, team_id, t.locks[user], None)
            return ("ok", False, {**body, "existing": True})
        if len(t.members) + len(t.locks) >= self.size:
            earliest = min(t.locks.values(), default=None)
            next_unlock = iso_ms(earliest + self.ttl_ms) if earliest is not None else None
            return (
                "error",
                "team_full",
                {"next_unlock_at": next_unlock, "earliest_locked_at": iso_ms(earliest)},
            )
        held = self.live_lock(user)
        released = None
        if held is not None:
            released = held[0]
            del self.teams[released].locks[user]
            self.teams[released].version += 1
        t.locks[user] = self.now_ms
        t.version += 1
        return ("ok", True, self._lock_body(user, team_id, self.now_ms, released))

    def with_free_seats(self, user: str | None = None) -> list[_TeamModel]:
        """The open teams with a free seat (not counting the ones `user` is a member of), in
        the order a join picks them: most seats taken, then the oldest, then the id."""
        teams = [
            t
            for t in self.teams.values()
            if t.status == "open"
            and len(t.members) + len(t.locks) < self.size
            and user not in t.members
        ]
        return sorted(
            teams, key=lambda t: (-len(t.members) - len(t.locks), t.created_ms, t.team_id)
        )

    def join(self, user: str) -> Answer:
        self.settle()
        held = self.live_lock(user)
        if held is not None:  # one lock per user and activity: it is the answer
            team_id, at = held
            return ("ok", False, {**self._lock_body(user, team_id, at, None), "existing": True})
        candidates = self.with_free_seats(user)
        if not candidates:
            expiries = [
                at + self.ttl_ms
                for t in self.teams.values()
                if t.status == "open"
                for at in t.locks.values()
            ]
            next_unlock = iso_ms(min(expiries)) if expiries else None
            return ("error", "no_team_available", {"next_unlock_at": next_unlock})
        team = candidates[0]
        team.locks[user] = self.now_ms
        team.version += 1
        return ("ok", True, self._lock_body(user, team.team_id, self.now_ms, None))

    def unlock(self, user: str, team_id: str) -> Answer:
        self.settle()
        released = self.teams[team_id].locks.pop(user, None) is not None
        self.teams[team_id].version += released
        return ("ok", released)

    def confirm(self, user: str, team_id: str, order: str) -> Answer:
        self.settle()
        t = self.teams[team_id]
        if user in t.members:
            if t.members[user][0] == order:
                return ("ok", False, self._confirm_body(team_id, user))
            return ("error", "already_member", {})
        if t.status == "formed":
            return ("error", "team_formed", {})
        if t.status == "failed":
            return ("error", "team_failed", {})
        if user not in t.locks:
            return ("error", "lock_required", {})
        del t.locks[user]
        t.members[user] = (order, self.now_ms)
        t.version += 1
        if len(t.members) == self.size:
            t.status, t.formed_ms, t.formed_by = "formed", self.now_ms, user
            t.version += 1
            t.locks.clear()
        return ("ok", True, self._confirm_body(team_id, user))

    def _confirm_body(self, team_id: str, user: str) -> dict[str, Any]:
        """`formed` belongs to the confirm that completed the team (and its repeats)."""
        return {"team": self.team_body(team_id), "formed": self.teams[team_id].formed_by == user}

    def current_lock(self, user: str) -> Answer:
        self.settle()
        held = self.live_lock(user)
        if held is None:
            return ("error", "no_lock", {})
        team_id, at = held
        body = {"team_id": team_id, "locked_at": iso_ms(at), "expires_at": iso_ms(at + self.ttl_ms)}
        return ("ok", body)


# -- guarantees read from the service alone ----------------------------------------


def _check_team(team: Mapping[str, Any], now_ms: int) -> None:
    """Guarantee 1 and the §3 team shape, from one get_team answer."""
    size, members, locks = team["size"], team["members"], team["locks"]
    users = [m["user_id"] for m in members]
    assert len(users) == len(set(users)), f"a member twice in {team['team_id']}: {users}"
    if team["status"] == "open":
        assert len(members) + len(locks) <= size, team
        assert team["free_seats"] == size - len(members) - len(locks), team
    elif team["status"] == "formed":
        assert len(members) == size, team
        assert not locks, team
    else:
        assert team["status"] == "failed", team
        assert not locks, team
    now = iso_ms(now_ms)
    assert now is not None
    for lock in locks:
        # ISO-8601 UTC with fixed-width fields compares like the instant it names.
        assert lock["expires_at"] > now, f"expired lock listed at {now}: {lock}"
    assert [lk["locked_at"] for lk in locks] == sorted(lk["locked_at"] for lk in locks), team


def _check_one_lock_per_user(teams: list[Team]) -> dict[str, str]:
    """Guarantee 2: at most one listed lock per user across the activity; user -> team."""
    holders = Counter(lock["user_id"] for team in teams for lock in team["locks"])
    doubled = {user: n for user, n in holders.items() if n > 1}
    assert not doubled, f"users holding several locks: {doubled}"
    return {lock["user_id"]: team["team_id"] for team in teams for lock in team["locks"]}


# -- the state machine --------------------------------------------------------------

USER = st.integers(0, MAX_USERS - 1)
TEAM = st.integers(0, MAX_TEAMS - 1)
# Mostly short steps, so that locks expire and get re-taken before every deadline passes.
SECONDS = st.one_of(st.integers(0, 6), st.integers(0, 12), st.integers(0, 70))


@dataclass
class _Call:
    kind: str
    args: tuple[str, ...]
    answer: Answer
    now_ms: int


class TeamMachine(RuleBasedStateMachine):
    """Random lock, unlock, confirm, retry and time steps on one activity, checked by _Model."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: EngineStack | None = None
        self.model: _Model
        self.users: list[str] = []
        self.team_ids: list[str] = []
        self.last: _Call | None = None
        self.read_after_step = True

    def teardown(self) -> None:
        if self.stack is not None:
            self.stack.close()

    @property
    def teams(self) -> Any:
        assert self.stack is not None
        return self.stack.services.teams

    @initialize(
        team_size=st.integers(2, 4),
        n_users=st.integers(5, MAX_USERS),
        leaders=st.lists(st.integers(0, MAX_USERS - 1), min_size=2, max_size=MAX_TEAMS),
        gaps=st.lists(st.integers(0, 30), min_size=MAX_TEAMS, max_size=MAX_TEAMS),
    )
    def open_teams(self, team_size: int, n_users: int, leaders: list[int], gaps: list[int]) -> None:
        """One activity; 2-4 teams opened some seconds apart, so their deadlines differ."""
        self.stack = EngineStack()
        self.model = _Model(team_size, self.stack.start_ms)
        self.users = [f"u{i}" for i in range(n_users)]
        activity = self.teams.activities.create_activity(
            ACTIVITY, team_size=team_size, lock_ttl_s=LOCK_TTL_S, team_deadline_s=TEAM_DEADLINE_S
        )
        self.stack.run(activity)
        for index, (leader, gap) in enumerate(zip(leaders, gaps, strict=False)):
            self._advance(gap)
            team_id, leader_id = f"t{index}", self.users[leader % n_users]
            outcome = self.stack.run(
                self.teams.activities.open_team(ACTIVITY, leader_id, team_id=team_id)
            )
            assert outcome.created
            self.model.open(team_id, leader_id)
            self.team_ids.append(team_id)

    def _advance(self, seconds: int) -> None:
        assert self.stack is not None
        self.stack.services.clock.advance(seconds)
        self.model.now_ms += seconds * 1000

    def _user(self, index: int) -> str:
        return self.users[index % len(self.users)]

    def _team(self, index: int) -> str:
        return self.team_ids[index % len(self.team_ids)]

    def _call(self, kind: str, *args: str) -> Answer:
        """Make one mutating call, check its answer against the model, remember it."""
        assert self.stack is not None
        if kind == "lock":
            user, team_id = args
            actual = _answer(self.stack, self.teams.seats.lock(ACTIVITY, team_id, user))
            expected = self.model.lock(user, team_id)
        elif kind == "join":
            (user,) = args
            actual = _answer(self.stack, self.teams.seats.join(ACTIVITY, user))
            expected = self.model.join(user)
        elif kind == "unlock":
            user, team_id = args
            actual = _answer(self.stack, self.teams.seats.unlock(ACTIVITY, team_id, user))
            expected = self.model.unlock(user, team_id)
        else:
            user, team_id, order = args
            actual = _answer(self.stack, self.teams.seats.confirm(ACTIVITY, team_id, user, order))
            expected = self.model.confirm(user, team_id, order)
        assert actual == expected, f"{kind}{args} at +{self._elapsed_s()}s"
        event(f"{kind}: {_label(actual)}")
        self.last = _Call(kind, args, actual, self.model.now_ms)
        return actual

    def _elapsed_s(self) -> float:
        assert self.stack is not None
        return (self.model.now_ms - self.stack.start_ms) / 1000

    @rule(user=USER, team=TEAM)
    def lock(self, user: int, team: int) -> None:
        self._call("lock", self._user(user), self._team(team))

    @rule(user=USER)
    def join(self, user: int) -> None:
        """Join any team (SPEC §3): the model says which team, or no_team_available."""
        self._call("join", self._user(user))

    @rule(leader=USER)
    def open_another(self, leader: int) -> None:
        """A team opened mid-run: a new candidate for joins, at the back of its tie."""
        assert self.stack is not None
        if len(self.team_ids) >= MAX_TEAMS + 2:
            return
        team_id, leader_id = f"t{len(self.team_ids)}", self._user(leader)
        outcome = self.stack.run(
            self.teams.activities.open_team(ACTIVITY, leader_id, team_id=team_id)
        )
        assert outcome.created
        self.model.open(team_id, leader_id)
        self.team_ids.append(team_id)
        self.last = None  # a retry of what came before may now be answered otherwise

    @rule(pick=st.integers(0, 10), team=TEAM)
    def switch(self, pick: int, team: int) -> None:
        """Someone who holds a lock (or held one before time moved) asks for a seat elsewhere."""
        held = self.model.holders()
        if not held:
            self._call("lock", self._user(pick), self._team(team))
            return
        user, current = held[pick % len(held)]
        others = [tid for tid in self.team_ids if tid != current]
        self._call("lock", user, others[team % len(others)])

    @rule(pick=st.integers(0, 10), order=st.sampled_from(ORDERS))
    def pay(self, pick: int, order: str) -> None:
        """A holder of a live lock pays for that seat (so teams do form); else someone locks."""
        self.model.settle()
        held = self.model.holders()
        if not held:
            self._call("lock", self._user(pick), self._team(pick))
            return
        user, team_id = held[pick % len(held)]
        self._call("confirm", user, team_id, order)

    @rule(user=USER, team=TEAM, own=st.booleans())
    def unlock(self, user: int, team: int, own: bool) -> None:
        """Any user and team, or (own) a holder giving back the seat they hold."""
        held = self.model.holders()
        if own and held:
            self._call("unlock", *held[user % len(held)])
            return
        self._call("unlock", self._user(user), self._team(team))

    @rule(user=USER, team=TEAM, order=st.sampled_from(ORDERS))
    def confirm(self, user: int, team: int, order: str) -> None:
        self._call("confirm", self._user(user), self._team(team), order)

    @rule()
    def repeat_last_call(self) -> None:
        """Guarantee 8: a retried call never applies twice."""
        if self.last is None:
            return
        first = self.last
        again = self._call(first.kind, *first.args)
        if first.now_ms != self.model.now_ms:
            return  # time moved on: the model alone says what the retry must answer
        if first.answer[0] == "error":
            assert again == first.answer, "a retry of a refused call answered differently"
        elif first.kind in ("lock", "join"):
            body = first.answer[2]
            assert again[:2] == ("ok", False) and again[2]["existing"] is True, again
            assert again[2]["team_id"] == body["team_id"], again
            assert again[2]["locked_at"] == body["locked_at"], again
            assert again[2]["expires_at"] == body["expires_at"], again
        elif first.kind == "unlock":
            assert again == ("ok", False), again
        else:
            assert again == ("ok", False, first.answer[2]), "a repeated confirm differed"
            members = [m["user_id"] for m in again[2]["team"]["members"]]
            assert members.count(first.args[0]) == 1, members

    @rule(seconds=SECONDS, look=st.booleans())
    def advance(self, seconds: int, look: bool) -> None:
        """Let time pass; without a look, the next call meets the ended teams and locks first."""
        self._advance(seconds)
        # Reading every team applies the lazy deadline and expiry checks; skipping that
        # read once lets the next mutating call be the first to notice what time did.
        self.read_after_step = look

    @invariant()
    def service_keeps_the_guarantees(self) -> None:
        if self.stack is None:
            return
        if not self.read_after_step:
            self.read_after_step = True
            return
        self.model.settle()
        teams = [
            self.stack.run(self.teams.activities.get_team(ACTIVITY, tid)) for tid in self.team_ids
        ]
        for team in teams:
            _check_team(team, self.model.now_ms)
        holder = _check_one_lock_per_user(teams)
        for user in self.users:
            current = _answer(self.stack, self.teams.seats.current_lock(ACTIVITY, user))
            if user in holder:
                assert current[0] == "ok" and current[1]["team_id"] == holder[user], (user, current)
            else:
                assert current == ("error", "no_lock", {}), (user, current)
            assert current == self.model.current_lock(user), user
        for team in teams:
            assert team == self.model.team_body(team["team_id"])
        # The list of open teams: the order a join picks in, each team as get_team answers.
        page = self.stack.run(self.teams.activities.list_open_teams(ACTIVITY, 100))
        listed = [self.model.team_body(t.team_id) for t in self.model.with_free_seats()]
        assert page == {"teams": listed, "next_cursor": None}

    @invariant()
    def open_seat_index_matches_the_teams(self) -> None:
        """Whatever time did unseen, the index lists exactly the teams Redis holds as open
        with a free seat (locks counted as stored), at their seat score."""
        if self.stack is None:
            return
        redis, keys = self.stack.redis, self.stack.services.keys
        indexed = self.stack.run(indexed_open_seats(redis, keys, ACTIVITY))
        assert indexed == self.stack.run(recomputed_open_seats(redis, keys, ACTIVITY))


TestTeamMachine = TeamMachine.TestCase
TestTeamMachine.settings = hypothesis_settings(
    max_examples=40, stateful_step_count=30, deadline=None
)


# -- a bug the machine found, kept as a minimal example -----------------------------


def test_switching_out_of_a_team_past_its_deadline_releases_nothing() -> None:
    """A team fails at its deadline (SPEC §1.1, lua/_team_lib.lua fail_team): from then on
    its locks are gone, so a new lock elsewhere released nothing and must say
    `released_team_id: null`, as it does when anything read the old team first."""
    stack = EngineStack()
    try:
        teams, clock = stack.services.teams, stack.services.clock
        stack.run(
            teams.activities.create_activity(
                ACTIVITY, team_size=3, lock_ttl_s=10, team_deadline_s=60
            )
        )
        stack.run(teams.activities.open_team(ACTIVITY, "leader_a", team_id="a"))  # deadline +60 s
        clock.advance(30)
        stack.run(teams.activities.open_team(ACTIVITY, "leader_b", team_id="b"))  # deadline +90 s
        clock.advance(25)
        stack.run(teams.seats.lock(ACTIVITY, "a", "u1"))  # expires at +65 s
        clock.advance(6)  # +61 s: team a failed at +60 s; u1's lock there went with it
        switched = stack.run(teams.seats.lock(ACTIVITY, "b", "u1"))
        assert switched.body["released_team_id"] is None, switched.body
    finally:
        stack.close()


# -- lock attempts with no time passing --------------------------------------------


@hypothesis_settings(max_examples=30, deadline=None)
@given(
    size=st.integers(2, 4),
    attempts=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=25),
)
def test_lock_attempts_without_time_fill_exactly_the_free_seats(
    size: int, attempts: list[tuple[int, int]]
) -> None:
    """Each attempt is granted exactly when the team has a free seat; switching frees one.

    (The closed form "granted = min(distinct requesters who stayed, size - 1)" does not
    hold: one user takes the last seat, a second is refused, the first switches away,
    and the team ends with no lock although one requester stayed. So the expectation is
    replayed attempt by attempt instead.)
    """
    stack = EngineStack()
    try:
        services = stack.services.teams
        stack.run(
            services.activities.create_activity(ACTIVITY, team_size=size, lock_ttl_s=LOCK_TTL_S)
        )
        team_ids = [f"t{i}" for i in range(3)]
        for index, tid in enumerate(team_ids):
            stack.run(
                services.activities.open_team(ACTIVITY, f"u{index}", team_id=tid)
            )  # u0..u2 lead
        holder: dict[str, str] = {}
        for user_index, team_index in attempts:
            user, tid = f"u{user_index}", team_ids[team_index]
            answer = _answer(stack, services.seats.lock(ACTIVITY, tid, user))
            if user == f"u{team_index}":
                assert answer[:2] == ("error", "already_member"), (user, tid, answer)
            elif holder.get(user) == tid:
                assert answer[:2] == ("ok", False), (user, tid, answer)
            elif sum(1 for t in holder.values() if t == tid) == size - 1:
                assert answer[:2] == ("error", "team_full"), (user, tid, answer)
            else:
                assert answer[:2] == ("ok", True), (user, tid, answer)
                assert answer[2]["released_team_id"] == holder.get(user), (user, tid, answer)
                holder[user] = tid
        teams = [stack.run(services.activities.get_team(ACTIVITY, tid)) for tid in team_ids]
        for team in teams:
            _check_team(team, stack.start_ms)
            granted = sorted(user for user, tid in holder.items() if tid == team["team_id"])
            assert sorted(lock["user_id"] for lock in team["locks"]) == granted, team
        assert _check_one_lock_per_user(teams) == holder
    finally:
        stack.close()
