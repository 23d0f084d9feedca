"""The codecs read what the scripts write, and build the keys SQL holds (both backends).

Each test drives the real Lua scripts, then reads the raw Redis values and the SQL rows
the write-behind made, and checks them against groupbuy.locks.codec and
groupbuy.redpacket.codec. A property test checks that build and parse are inverse.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from groupbuy.locks import codec as team_codec
from groupbuy.locks.codes import TeamCode
from groupbuy.redpacket import codec as packet_codec
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow, PacketRow
from groupbuy.services import Services
from groupbuy.storage.events import EventRow

AID, TID = "codec-a", "codec-t"


async def _team_script(services: Services, name: str, user: str, *args: Any) -> list[Any]:
    keys = [*services.keys.team_keys(AID, TID), services.keys.user_lock(AID, user)]
    return await services.scripts.call(name, keys, [AID, TID, services.clock.shift_ms, *args])


async def _outbox(services: Services, stream: str) -> list[dict[str, str]]:
    return [fields for _id, fields in await services.redis.xrange(stream)]


async def _event_keys(services: Services) -> set[str]:
    async with services.database.sessions() as session:
        return set(await session.scalars(select(EventRow.dedup_key)))


async def test_team_values_written_by_the_scripts_parse(services: Services) -> None:
    teams, keys = services.teams, services.keys
    await teams.create_activity(AID, team_size=2, lock_ttl_s=60)
    await teams.open_team(AID, "leader", team_id=TID, order_id="order-l")

    locked = await _team_script(services, "team_lock", "bob", "bob", "")
    assert int(locked[0]) == TeamCode.OK
    lock = team_codec.parse_user_lock(await services.redis.get(keys.user_lock(AID, "bob")))
    assert lock == team_codec.UserLock(TID, int(locked[1]), int(locked[2]))
    assert lock.expires_at_ms - lock.locked_at_ms == 60_000

    confirmed = await _team_script(services, "team_confirm", "bob", "bob", "order-b")
    assert int(confirmed[0]) == TeamCode.OK
    members = {
        user: team_codec.parse_member(value)
        for user, value in (await services.redis.hgetall(keys.team_members(AID, TID))).items()
    }
    assert [(m.seq, m.order_id) for m in (members["leader"], members["bob"])] == [
        (1, "order-l"),
        (2, "order-b"),
    ]
    assert members["leader"].joined_at_ms <= members["bob"].joined_at_ms
    value = await services.redis.hget(keys.team_members(AID, TID), "bob")
    assert value == team_codec.member_value(*members["bob"])

    # the team formed: its record lists the members in joining order
    records = await _outbox(services, keys.outbox(AID))
    formed = [r for r in records if r["type"] == "team.formed"]
    assert len(formed) == 1
    pairs: list[tuple[str, str | None]] = [("leader", "order-l"), ("bob", "order-b")]
    assert team_codec.parse_member_list(formed[0]["members"]) == pairs
    assert team_codec.member_list(pairs) == formed[0]["members"]

    # the write-behind stores the events under the keys the codec builds and parses
    await teams.record_pending()
    stored = await _event_keys(services)
    expected = {
        team_codec.team_event_key("team.opened", AID, TID),
        team_codec.team_event_key("team.member_joined", AID, TID, "bob"),
        team_codec.team_event_key("team.formed", AID, TID),
    }
    assert expected <= stored
    for key in expected:
        parsed = team_codec.parse_team_event_key(key)
        assert parsed is not None and (parsed.activity_id, parsed.team_id) == (AID, TID)


async def test_an_expired_lock_event_has_the_codec_key(services: Services) -> None:
    teams = services.teams
    await teams.create_activity(AID, team_size=3, lock_ttl_s=10)
    await teams.open_team(AID, "leader", team_id=TID)
    locked = await teams.lock(AID, TID, "carol")
    services.clock.advance(11)
    await teams.sweep("lock_due", 100)
    await teams.record_pending()
    locked_at_ms = _ms(locked.body["locked_at"])
    key = team_codec.team_event_key("lock.expired", AID, TID, "carol", locked_at_ms)
    assert key in await _event_keys(services)


async def test_packet_values_and_ledger_keys_agree_with_scripts_and_sql(
    services: Services,
) -> None:
    packets, keys = services.packets, services.keys
    await packets.deposit("alice", 1000, "top-up-1")
    await packets.send("alice", 600, 3, packet_id="pk-c", expires_in_s=60)
    stream_keys = keys.packet_keys("pk-c")
    replies = {}
    for user in ("bob", "carol"):
        reply = await services.scripts.call(
            "packet_grab", stream_keys, ["pk-c", services.clock.shift_ms, user]
        )
        assert int(reply[0]) == PacketCode.OK
        replies[user] = int(reply[1])
    grabs = {
        user: packet_codec.parse_grab(value)
        for user, value in (await services.redis.hgetall(stream_keys[2])).items()
    }
    assert {user: grab.amount_cents for user, grab in grabs.items()} == replies
    assert sorted(grab.seq for grab in grabs.values()) == [1, 2]
    for user, grab in grabs.items():
        assert await services.redis.hget(stream_keys[2], user) == packet_codec.grab_value(*grab)

    # expire it so that the refund is recorded too, then write everything to SQL
    services.clock.advance(61)
    await packets.expire_due()
    await packets.record_pending()
    async with services.database.sessions() as session:
        entries = dict(
            (key, kind)
            for key, kind in await session.execute(
                select(LedgerEntryRow.business_key, LedgerEntryRow.kind)
            )
        )
        grab_keys = set(
            await session.scalars(
                select(packet_codec.grab_credit_key_sql(GrabRow.packet_id, GrabRow.user_id))
            )
        )
        debit_sql, refund_sql = (
            await session.execute(
                select(
                    packet_codec.packet_debit_key_sql(PacketRow.packet_id),
                    packet_codec.refund_key_sql(PacketRow.packet_id),
                ).where(PacketRow.packet_id == "pk-c")
            )
        ).one()
    expected = {
        packet_codec.deposit_key("top-up-1"): "deposit",
        packet_codec.packet_debit_key("pk-c"): "packet_debit",
        packet_codec.grab_credit_key("pk-c", "bob"): "grab_credit",
        packet_codec.grab_credit_key("pk-c", "carol"): "grab_credit",
        packet_codec.refund_key("pk-c"): "refund_credit",
    }
    assert entries == expected
    assert grab_keys == {packet_codec.grab_credit_key("pk-c", u) for u in ("bob", "carol")}
    assert (debit_sql, refund_sql) == (
        packet_codec.packet_debit_key("pk-c"),
        packet_codec.refund_key("pk-c"),
    )
    for key, kind in expected.items():
        named = packet_codec.parse_business_key(key)
        assert named is not None and packet_codec.ENTRY_KINDS[named.kind] == kind
    stored = await _event_keys(services)
    for kind in ("packet.sent", "packet.refunded"):
        key = packet_codec.packet_event_key(kind, "pk-c")
        assert key in stored
        assert packet_codec.parse_packet_event_key(key) == (kind, "pk-c")


def _ms(stamp: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


ids = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
stamps = st.integers(0, 2**53)


@given(seq=st.integers(1, 50), at=stamps, order=st.one_of(st.none(), ids))
def test_member_values_round_trip(seq: int, at: int, order: str | None) -> None:
    value = team_codec.member_value(seq, at, order)
    assert team_codec.parse_member(value) == team_codec.Member(seq, at, order)


@given(team=ids, locked=stamps, expires=stamps)
def test_user_lock_values_round_trip(team: str, locked: int, expires: int) -> None:
    value = team_codec.user_lock_value(team, locked, expires)
    assert team_codec.parse_user_lock(value) == team_codec.UserLock(team, locked, expires)


@given(members=st.lists(st.tuples(ids, st.one_of(st.none(), ids)), max_size=10))
def test_member_lists_round_trip(members: list[tuple[str, str | None]]) -> None:
    assert team_codec.parse_member_list(team_codec.member_list(members)) == members


@given(kind=st.sampled_from(["team.opened", "team.formed"]), aid=ids, tid=ids, user=ids)
def test_team_event_keys_round_trip(kind: str, aid: str, tid: str, user: str) -> None:
    for key in (
        team_codec.team_event_key(kind, aid, tid),
        team_codec.team_event_key(kind, aid, tid, user),
    ):
        assert team_codec.parse_team_event_key(key) == team_codec.TeamEventKey(kind, aid, tid)
    assert packet_codec.parse_packet_event_key(team_codec.team_event_key(kind, aid, tid)) is None


@given(seq=st.integers(1, 100_000), cents=st.integers(1, 10**12), at=stamps)
def test_grab_values_round_trip(seq: int, cents: int, at: int) -> None:
    value = packet_codec.grab_value(seq, cents, at)
    assert packet_codec.parse_grab(value) == packet_codec.Grab(seq, cents, at)


@given(packet=ids, user=ids, reference=ids)
def test_business_keys_round_trip(packet: str, user: str, reference: str) -> None:
    parse = packet_codec.parse_business_key
    assert parse(packet_codec.deposit_key(reference)) == packet_codec.BusinessKey(
        "deposit", reference=reference
    )
    assert parse(packet_codec.packet_debit_key(packet)) == packet_codec.BusinessKey(
        "packet_debit", packet_id=packet
    )
    assert parse(packet_codec.refund_key(packet)) == packet_codec.BusinessKey(
        "refund", packet_id=packet
    )
    assert parse(packet_codec.grab_credit_key(packet, user)) == packet_codec.BusinessKey(
        "grab", packet_id=packet, user_id=user
    )
    key = packet_codec.packet_event_key("packet.sent", packet)
    assert packet_codec.parse_packet_event_key(key) == ("packet.sent", packet)
    assert team_codec.parse_team_event_key(key) is None


def test_malformed_values_are_refused() -> None:
    for parse, value in (
        (team_codec.parse_member, "1|x|o"),
        (team_codec.parse_member, "1"),
        (team_codec.parse_user_lock, "t|1"),
        (packet_codec.parse_grab, "1|2"),
        (packet_codec.parse_grab, "1|a|3"),
    ):
        try:
            parse(value)
        except ValueError:
            continue
        raise AssertionError(f"{value!r} parsed")
    assert packet_codec.parse_business_key("grab:pk") is None
    assert packet_codec.parse_business_key("other:x") is None
