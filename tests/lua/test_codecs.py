"""The codecs against what the scripts really write, and against what SQL holds after the
write-behind (on fakeredis and on a real redis-server); then build -> parse round trips.

Ids here use every character class SPEC §2 allows ('-' and '_' included).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from groupbuy_client.wire import to_ms
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy import String, create_engine, literal, select

from groupbuy.locks import codec as team_codec
from groupbuy.locks import records as team_records
from groupbuy.locks.codes import TeamCode
from groupbuy.locks.confirm import team_confirm
from groupbuy.locks.lock import team_lock
from groupbuy.locks.models import MemberRow
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.redpacket import codec as packet_codec
from groupbuy.redpacket import records as packet_records
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.grab import packet_grab
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow, PacketRow
from groupbuy.redpacket.specs import PacketReply, PacketScripts
from groupbuy.services import Services
from groupbuy.storage.events import EventRow

AID = "act_1-x"
TID = "team-A_1"
RETENTION_MS = 3_600_000


async def _stream(services: Services, key: str) -> list[dict[str, str]]:
    return [fields for _id, fields in await services.redis.xrange(key)]


async def _event_keys(services: Services) -> set[str]:
    async with services.database.sessions() as session:
        return set(await session.scalars(select(EventRow.dedup_key)))


async def _ledger(services: Services) -> dict[str, tuple[str, str, int]]:
    async with services.database.sessions() as session:
        rows = await session.execute(
            select(
                LedgerEntryRow.business_key,
                LedgerEntryRow.user_id,
                LedgerEntryRow.kind,
                LedgerEntryRow.amount_cents,
            )
        )
        return {key: (user, kind, int(cents)) for key, user, kind, cents in rows}


class Teams:
    """Calls the team scripts directly, as the engine does, so the outbox can be read raw."""

    def __init__(self, services: Services) -> None:
        self.scripts = TeamScripts(services.scripts, services.keys, services.clock)

    async def open(self, team_id: str, leader: str, order: str) -> TeamReply:
        return await self.scripts.open(AID, team_id, leader, order, RETENTION_MS)

    async def lock(self, team_id: str, user: str) -> TeamReply:
        return await team_lock(self.scripts, AID, team_id, user, "")

    async def confirm(self, team_id: str, user: str, order: str) -> tuple[TeamCode, bool]:
        """The confirm's code and whether it formed the team."""
        reply = await team_confirm(self.scripts, AID, team_id, user, order)
        assert reply.code in (TeamCode.OK, TeamCode.EXISTING), reply
        return reply.code, reply.formed


async def test_team_values_written_by_the_scripts_parse_and_rebuild(services: Services) -> None:
    teams, redis, keys = Teams(services), services.redis, services.keys
    await services.teams.activities.create_activity(AID, team_size=3, lock_ttl_s=60)
    opened = await teams.open(TID, "lead-1", "")  # a leader without an order
    assert opened.code == TeamCode.OK

    locks: dict[str, tuple[int, int]] = {}
    for user in ("user_2", "user-3"):
        locked = await teams.lock(TID, user)
        assert locked.code in (TeamCode.OK, TeamCode.EXISTING), locked
        assert (locked.code, locked.released_team_id) == (TeamCode.OK, "")
        locked_at, expires_at = locked.locked_at_ms, locked.expires_at_ms
        locks[user] = (locked_at, expires_at)
        raw = await redis.get(keys.user_lock(AID, user))
        deadline = int(await redis.hget(keys.team(AID, TID), "deadline_ms"))
        parsed = (TID, locked_at, expires_at, deadline)
        assert team_codec.parse_current_lock(raw) == parsed
        assert team_codec.current_lock_value(*parsed) == raw
    assert await teams.confirm(TID, "user_2", "order-2") == (TeamCode.OK, False)
    assert await teams.confirm(TID, "user-3", "order_3") == (TeamCode.OK, True)

    raw_members = await redis.hgetall(keys.team_members(AID, TID))
    members = {user: team_codec.parse_member(value) for user, value in raw_members.items()}
    assert {user: (m.seq, m.order_id) for user, m in members.items()} == {
        "lead-1": (1, None),
        "user_2": (2, "order-2"),
        "user-3": (3, "order_3"),
    }
    for user, value in raw_members.items():
        assert team_codec.member_value(*members[user]) == value
    # A member joins after locking and no later than the lock's expiry.
    for user, (locked_at, expires_at) in locks.items():
        assert locked_at <= members[user].joined_at_ms < expires_at

    records = await _stream(services, keys.outbox(AID))
    assert [r["type"] for r in records] == [
        "team.opened",
        "team.member_joined",
        "team.member_joined",
        "team.formed",
    ]
    joined = {r["user_id"]: r for r in records if r["type"] == "team.member_joined"}
    for user, record in joined.items():
        assert (int(record["seq"]), int(record["at_ms"])) == members[user][:2]
    formed = records[-1]["members"]
    listed = [("lead-1", None), ("user_2", "order-2"), ("user-3", "order_3")]
    assert team_codec.parse_member_list(formed) == listed
    assert team_codec.member_list(listed) == formed == "lead-1|,user_2|order-2,user-3|order_3"

    # The write-behind: member rows hold what the values said, events the codec's keys.
    assert await services.team_writer.drain_all() == 4
    async with services.database.sessions() as session:
        rows = (await session.scalars(select(MemberRow).where(MemberRow.team_id == TID))).all()
    assert {r.user_id: (r.seq, to_ms(r.joined_at), r.order_id) for r in rows} == {
        user: tuple(m) for user, m in members.items()
    }
    expected = {
        team_records.team_event_key("team.opened", AID, TID),
        team_records.team_event_key("team.member_joined", AID, TID, "user_2"),
        team_records.team_event_key("team.member_joined", AID, TID, "user-3"),
        team_records.team_event_key("team.formed", AID, TID),
    }
    assert await _event_keys(services) == expected


async def test_lock_expired_and_failed_team_keys_match_sql(services: Services) -> None:
    teams, keys = Teams(services), services.keys
    await services.teams.activities.create_activity(
        AID, team_size=3, lock_ttl_s=5, team_deadline_s=60
    )
    await teams.open(TID, "lead-1", "o-1")
    locked = await teams.lock(TID, "user_9")
    assert locked.code in (TeamCode.OK, TeamCode.EXISTING), locked
    services.clock.advance(5)
    assert (await services.teams.sweeps.expire_locks(100))["locks_expired"] == 1
    services.clock.advance(60)
    await teams.lock(TID, "user_8")  # past the deadline: the script fails the team lazily
    failed = [r for r in await _stream(services, keys.outbox(AID)) if r["type"] == "team.failed"]
    assert [team_codec.parse_member_list(r["members"]) for r in failed] == [[("lead-1", "o-1")]]
    await services.team_writer.drain_all()
    found = await _event_keys(services)
    assert found == {
        team_records.team_event_key("team.opened", AID, TID),
        team_records.team_event_key("lock.expired", AID, TID, "user_9", locked.locked_at_ms),
        team_records.team_event_key("team.failed", AID, TID),
    }
    for key in found:
        parsed = team_records.parse_event_key(key)
        assert parsed is not None and team_records.team_event_key(*parsed) == key
        assert packet_records.parse_event_key(key) is None  # not the packet engine's


async def _grab(services: Services, packet_id: str, user: str) -> PacketReply:
    packets = PacketScripts(services.scripts, services.keys, services.clock)
    return await packet_grab(packets, packet_id, user, f"t-{user}_{packet_id}", 30_000)


async def test_packet_values_and_keys_match_the_scripts_and_sql(services: Services) -> None:
    packets, redis, keys = services.packets, services.redis, services.keys
    await packets.accounts.deposit("send-er_1", 1_000, "ref_42-a")
    await packets.sending.send("send-er_1", 300, 3, packet_id="pk-1_a", expires_in_s=60)
    await packets.sending.send("send-er_1", 7, 1, packet_id="pk-2_b")

    replies = {}
    for user in ("u-1", "u_2"):
        grabbed = await _grab(services, "pk-1_a", user)
        assert grabbed.code is PacketCode.OK
        replies[user] = grabbed.amount_cents
    assert (await _grab(services, "pk-2_b", "u-1")).code is PacketCode.OK

    raw_grabs = await redis.hgetall(keys.packet_keys("pk-1_a").grabs)
    grabs = {user: packet_codec.parse_grab(value) for user, value in raw_grabs.items()}
    assert {user: (g.seq, g.amount_cents, g.token) for user, g in grabs.items()} == {
        "u-1": (1, replies["u-1"], "t-u-1_pk-1_a"),
        "u_2": (2, replies["u_2"], "t-u_2_pk-1_a"),
    }
    for user, value in raw_grabs.items():
        assert packet_codec.grab_value(*grabs[user]) == value
    records = await _stream(services, keys.packet_outbox("pk-1_a"))
    assert {
        r["user_id"]: (int(r["seq"]), int(r["amount_cents"]), int(r["at_ms"])) for r in records
    } == {user: tuple(g)[:3] for user, g in grabs.items()}

    services.clock.advance(61)
    assert await packets.sweeps.expire_due() == {"due": 1, "expired": 1}
    await packets.writer.drain_all()
    async with services.database.sessions() as session:
        rows = (await session.scalars(select(GrabRow).where(GrabRow.packet_id == "pk-1_a"))).all()
    assert {r.user_id: (r.seq, r.amount_cents, to_ms(r.grabbed_at)) for r in rows} == {
        user: tuple(g)[:3] for user, g in grabs.items()
    }

    refunded = 300 - sum(replies.values())
    assert await _ledger(services) == {
        packet_codec.deposit_key("ref_42-a"): ("send-er_1", "deposit", 1_000),
        packet_codec.packet_debit_key("pk-1_a"): ("send-er_1", "packet_debit", -300),
        packet_codec.packet_debit_key("pk-2_b"): ("send-er_1", "packet_debit", -7),
        packet_codec.grab_credit_key("pk-1_a", "u-1"): ("u-1", "grab_credit", replies["u-1"]),
        packet_codec.grab_credit_key("pk-1_a", "u_2"): ("u_2", "grab_credit", replies["u_2"]),
        packet_codec.grab_credit_key("pk-2_b", "u-1"): ("u-1", "grab_credit", 7),
        packet_codec.refund_key("pk-1_a"): ("send-er_1", "refund_credit", refunded),
    }
    assert await _event_keys(services) == {
        packet_records.packet_event_key(kind, pid)
        for kind, pid in (
            ("packet.sent", "pk-1_a"),
            ("packet.sent", "pk-2_b"),
            ("packet.sold_out", "pk-2_b"),
            ("packet.refunded", "pk-1_a"),
        )
    }
    for key in await _event_keys(services):
        parsed = packet_records.parse_event_key(key)
        assert parsed is not None and packet_records.packet_event_key(*parsed) == key
        assert team_records.parse_event_key(key) is None  # not the team engine's


async def test_sql_built_keys_equal_the_python_built_ones(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("send-er_1", 100, "ref-1")
    await packets.sending.send("send-er_1", 10, 2, packet_id="pk-1_a", expires_in_s=60)
    for user in ("u-1", "u_2"):
        await packets.grabs.grab("pk-1_a", user)
    await packets.writer.drain_all()
    async with services.database.sessions() as session:
        grab_keys = (
            await session.execute(
                select(
                    GrabRow.packet_id,
                    GrabRow.user_id,
                    packet_codec.grab_credit_key_sql(GrabRow.packet_id, GrabRow.user_id),
                )
            )
        ).all()
        packet_keys = (
            await session.execute(
                select(
                    PacketRow.packet_id,
                    packet_codec.packet_debit_key_sql(PacketRow.packet_id),
                    packet_codec.refund_key_sql(PacketRow.packet_id),
                )
            )
        ).all()
        ledger_keys = set(await session.scalars(select(LedgerEntryRow.business_key)))
    assert sorted(grab_keys) == [
        ("pk-1_a", user, packet_codec.grab_credit_key("pk-1_a", user)) for user in ("u-1", "u_2")
    ]
    assert packet_keys == [
        ("pk-1_a", packet_codec.packet_debit_key("pk-1_a"), packet_codec.refund_key("pk-1_a"))
    ]
    # The joins of reconciliation find the entries the write-behind made.
    assert {key for _p, _u, key in grab_keys} | {packet_keys[0][1]} <= ledger_keys


# -- build -> parse round trips ------------------------------------------------------------

ids = st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z")
orders = st.one_of(st.none(), ids)
ms = st.integers(min_value=0, max_value=2**53)
TEAM_EVENTS = st.sampled_from(["team.opened", "team.formed", "team.failed"])


@given(seq=st.integers(1, 50), at=ms, order=orders)
def test_member_round_trips(seq: int, at: int, order: str | None) -> None:
    value = team_codec.member_value(seq, at, order)
    assert team_codec.parse_member(value) == (seq, at, order)
    assert team_codec.member_value(seq, at, "") == team_codec.member_value(seq, at, None)


@given(team_id=ids, locked_at=ms, ttl=ms, deadline=ms)
def test_current_lock_round_trips(team_id: str, locked_at: int, ttl: int, deadline: int) -> None:
    lock = (team_id, locked_at, locked_at + ttl, deadline)
    assert team_codec.parse_current_lock(team_codec.current_lock_value(*lock)) == lock


@given(members=st.lists(st.tuples(ids, orders), max_size=50))
def test_member_list_round_trips(members: list[tuple[str, str | None]]) -> None:
    assert team_codec.parse_member_list(team_codec.member_list(members)) == members


@given(kind=TEAM_EVENTS, aid=ids, tid=ids, user=ids, at=ms)
def test_team_event_keys_round_trip(kind: str, aid: str, tid: str, user: str, at: int) -> None:
    for key in (
        team_records.TeamEventKey(kind, aid, tid),
        team_records.TeamEventKey("team.member_joined", aid, tid, user),
        team_records.TeamEventKey("lock.expired", aid, tid, user, at),
    ):
        assert team_records.parse_event_key(team_records.team_event_key(*key)) == key


@given(seq=st.integers(1, 10_000), amount=ms, at=ms, token=st.one_of(st.just(""), ids))
def test_grab_round_trips(seq: int, amount: int, at: int, token: str) -> None:
    value = packet_codec.grab_value(seq, amount, at, token)
    assert packet_codec.parse_grab(value) == (seq, amount, at, token)


def test_a_grab_value_from_before_tokens_parses_with_no_token() -> None:
    assert packet_codec.parse_grab("3|250|1700000000000") == (3, 250, 1700000000000, "")


@given(packet_id=ids, user_id=ids, reference=ids)
def test_business_keys_round_trip(packet_id: str, user_id: str, reference: str) -> None:
    parse, BusinessKey = packet_codec.parse_business_key, packet_codec.BusinessKey
    assert parse(packet_codec.grab_credit_key(packet_id, user_id)) == BusinessKey(
        "grab", packet_id=packet_id, user_id=user_id
    )
    assert parse(packet_codec.refund_key(packet_id)) == BusinessKey("refund", packet_id=packet_id)
    assert parse(packet_codec.packet_debit_key(packet_id)) == BusinessKey(
        "packet_debit", packet_id=packet_id
    )
    assert parse(packet_codec.deposit_key(reference)) == BusinessKey("deposit", reference=reference)


@given(kind=st.sampled_from(packet_records.EVENT_TYPES), packet_id=ids)
def test_packet_event_keys_round_trip(kind: str, packet_id: str) -> None:
    key = packet_records.packet_event_key(kind, packet_id)
    assert packet_records.parse_event_key(key) == (kind, packet_id)


_SQLITE = create_engine("sqlite://")


@hypothesis_settings(max_examples=50)
@given(packet_id=ids, user_id=ids)
def test_sql_expressions_build_the_python_keys(packet_id: str, user_id: str) -> None:
    p, u = literal(packet_id, String), literal(user_id, String)
    with _SQLITE.connect() as connection:
        row = connection.execute(
            select(
                packet_codec.grab_credit_key_sql(p, u),
                packet_codec.refund_key_sql(p),
                packet_codec.packet_debit_key_sql(p),
            )
        ).one()
    assert tuple(row) == (
        packet_codec.grab_credit_key(packet_id, user_id),
        packet_codec.refund_key(packet_id),
        packet_codec.packet_debit_key(packet_id),
    )


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (team_codec.parse_member, "1|2"),
        (team_codec.parse_member, "x|2|o"),
        (team_codec.parse_current_lock, "|1|2|3"),
        (team_codec.parse_current_lock, "t|1|2"),
        (team_codec.parse_member_list, "u1"),
        (team_records.parse_event_key, "team.member_joined:a:t"),
        (team_records.parse_event_key, "lock.expired:a:t:u:soon"),
        (packet_codec.parse_grab, "1|2|3|t|5"),
        (packet_codec.parse_grab, "1|2"),
        (packet_codec.parse_grab, "1|-2|3"),
        (packet_codec.parse_business_key, "grab:p1"),
        (packet_codec.parse_business_key, "bonus:p1"),
        (packet_records.parse_event_key, "packet.sent:p1:extra"),
    ],
)
def test_malformed_values_and_keys_raise(parse: Callable[[str], object], value: str) -> None:
    with pytest.raises(ValueError):
        parse(value)


def test_each_codec_leaves_the_other_engines_event_keys_alone() -> None:
    assert team_records.parse_event_key("packet.sent:p1") is None
    assert packet_records.parse_event_key("team.opened:a:t") is None
