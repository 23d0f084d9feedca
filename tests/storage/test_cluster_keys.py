"""The key layout of Redis Cluster: every script call touches one slot, and the jobs and
the write-behind find their work in every slot.

These run with `[redis] cluster = true` on fakeredis (the keys checked with
`redis.crc.key_slot`) and on a one-node cluster (tests/support/cluster.py), where Redis
itself refuses a call whose keys span slots.
"""

from __future__ import annotations

import string
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.crc import key_slot
from sqlalchemy import func, select

from groupbuy import errors
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.redpacket.models import GrabRow, PacketRow
from groupbuy.services import Services, build_scheduler
from groupbuy.storage.events import EventRow
from groupbuy.storage.keys import SLOTS, Keys, slot_tag, slot_tags
from groupbuy.storage.specs import script_names


def slot(key: str) -> int:
    return key_slot(key.encode())


def ids_in_slots(make_key: Any, prefix: str, count: int) -> list[str]:
    """`count` ids whose keys (make_key(id)) sit in `count` different slots."""
    ids: list[str] = []
    seen: set[int] = set()
    n = 0
    while len(ids) < count:
        candidate = f"{prefix}{n}"
        n += 1
        if slot(make_key(candidate)) not in seen:
            seen.add(slot(make_key(candidate)))
            ids.append(candidate)
    return ids


def ids_in_one_slot(make_key: Any, prefix: str, count: int) -> list[str]:
    """`count` ids whose keys all sit in the slot of the first."""
    first = slot(make_key(f"{prefix}0"))
    ids = [f"{prefix}0"]
    n = 1
    while len(ids) < count:
        if slot(make_key(f"{prefix}{n}")) == first:
            ids.append(f"{prefix}{n}")
        n += 1
    return ids


# -- the slot tags ----------------------------------------------------------------------


def test_every_slot_has_a_short_tag_that_lands_in_it() -> None:
    tags = slot_tags()
    assert len(tags) == SLOTS and len(set(tags)) == SLOTS
    alphabet = set(string.ascii_letters + string.digits)
    for number, tag in enumerate(tags):
        assert len(tag) == 3 and set(tag) <= alphabet
        assert key_slot(f"gb:{{{tag}}}:pending:packets".encode()) == number
    assert slot_tag(0) == tags[0] and slot_tags() is tags  # built once per process


def test_cluster_keys_build_the_tags_when_made_not_in_the_first_request() -> None:
    slot_tags.cache_clear()
    Keys("gb")
    assert slot_tags.cache_info().currsize == 0  # one Redis server needs none
    Keys("gb", cluster=True)
    assert slot_tags.cache_info().currsize == 1


def test_one_redis_server_keeps_todays_key_names() -> None:
    keys = Keys("gb")
    assert keys.global_indexes() == [
        "gb:pending:activities",
        "gb:pending:packets",
        "gb:due:locks",
        "gb:due:deadlines",
        "gb:due:packets",
    ]
    assert keys.blocked_users() == keys.activity_blocklist("a1") == "gb:blocked_users"
    assert keys.dead_letters() == "gb:dead_letters"
    packet = keys.packet_keys("p1")
    assert [packet.pending, packet.due, packet.blocklist] == [
        "gb:pending:packets",
        "gb:due:packets",
        "gb:blocked_users",
    ]
    activity = keys.activity_keys("a1")
    assert [activity.pending, activity.due_locks, activity.due_deadlines] == [
        "gb:pending:activities",
        "gb:due:locks",
        "gb:due:deadlines",
    ]
    assert keys.activity_slot("a1") is None and keys.slot_of("anything") is None


def test_in_cluster_mode_an_index_needs_its_slot() -> None:
    keys = Keys("gb", cluster=True)
    with pytest.raises(ValueError, match="per slot"):
        keys.pending_packets()
    # The one hash every slot's copy is made from stays where it was.
    assert keys.blocked_users() == "gb:blocked_users"


@pytest.mark.parametrize("prefix", ["gb", "shop-7"])
def test_in_cluster_mode_each_entitys_keys_share_its_slot(prefix: str) -> None:
    keys = Keys(prefix, cluster=True)
    for activity_id in ids_in_slots(keys.activity, "act", 200):
        team = [
            *keys.team_keys(activity_id, "t1").named().values(),
            *keys.activity_keys(activity_id).named().values(),
            keys.activity(activity_id),
        ]
        built = [
            *team,
            keys.user_lock(activity_id, "u1"),
            keys.activity_blocklist(activity_id),
            keys.team_restoring(activity_id, "t1"),
        ]
        assert {slot(k) for k in built} == {keys.activity_slot(activity_id)}
    for packet_id in ids_in_slots(keys.packet_outbox, "pk", 200):
        built = [*keys.packet_keys(packet_id).named().values(), keys.packet_restoring(packet_id)]
        built.append(keys.dead_letters(keys.slot_of(keys.packet_outbox(packet_id))))
        assert {slot(k) for k in built} == {keys.packet_slot(packet_id)}
    for sender in ("s1", "s2", "sender-with-a-long-name"):
        built = [keys.sender_day(sender, 20_000), keys.blocked_users(keys.sender_slot(sender))]
        assert {slot(k) for k in built} == {keys.sender_slot(sender)}


# -- every script, as the services call it -------------------------------------------------


def record_script_calls(services: Services, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[tuple[str, list[str]]] = []
    call = services.scripts.call

    async def recorded(name: str, keys: list[str], args: list[Any]) -> list[Any]:
        calls.append((name, list(keys)))
        return await call(name, keys, args)

    monkeypatch.setattr(services.scripts, "call", recorded)
    return calls


async def test_every_script_call_of_the_services_touches_one_slot(
    cluster_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = cluster_services
    calls = record_script_calls(services, monkeypatch)
    teams, packets, keys, redis = services.teams, services.packets, services.keys, services.redis
    await teams.activities.create_activity("act1", team_size=2, lock_ttl_s=60, team_deadline_s=600)
    await teams.activities.open_team("act1", "lead", team_id="t1")
    await teams.seats.lock("act1", "t1", "u1")
    await teams.seats.current_lock("act1", "u1")
    await teams.seats.unlock("act1", "t1", "u1")
    await teams.seats.join("act1", "u2")
    await teams.activities.list_open_teams("act1", 10)
    await teams.activities.get_team("act1", "t1")
    await teams.seats.confirm("act1", "t1", "u2", "o2")
    await teams.seats.leave("act1", "t1", "u2", "o2")  # a refund: t1 was formed
    await teams.activities.update_activity("act1", stock=100)  # activity_sale
    await teams.activities.open_team("act1", "lead3", team_id="t3")
    await teams.dissolve("act1", "t3")
    await teams.activities.open_team("act1", "lead2", team_id="t2")
    await teams.seats.lock("act1", "t2", "u3")
    await teams.waitlist.join("act1", "w1", "t2")  # waitlist_join: t2 is full
    await teams.waitlist.read("act1", "w1")
    await teams.waitlist.lines("act1", ["t2"])
    await teams.waitlist.leave("act1", "w1")
    await teams.seats.extend("act1", "t2", "u3", 60)
    services.clock.advance(61)
    assert (await teams.sweeps.expire_locks(100))["locks_expired"] == 1
    await services.team_writer.drain_all()
    await teams.sweeps.release_ended()
    await redis.delete(*keys.team_keys("act1", "t2").named().values())
    assert (await teams.activities.get_team("act1", "t2"))["status"] == "open"  # rebuilt from SQL
    await teams.sweeps.reindex()
    await services.guesses.failed("192.0.2.1")  # guess_count: counted, then read
    assert await services.guesses.refused_for("192.0.2.1") is None

    await packets.accounts.deposit("s1", 10_000, "funds")
    await packets.sending.send("s1", 1000, 2, packet_id="pk1", expires_in_s=60)
    await packets.grabs.grab("pk1", "g1")
    await packets.reads.get("pk1")
    await packets.reads.grab_of("pk1", "g1")  # packet_grab_read
    with pytest.raises(errors.InsufficientFunds):
        await packets.sending.send("poor", 1000, 2, packet_id="pk2")  # counted, then taken back
    await packets.sending.send("s1", 1000, 2, packet_id="pk3", expires_in_s=6000)
    await packets.writer.drain_all()
    pk3 = keys.packet_keys("pk3")
    await redis.delete(*pk3.own())
    await packets.grabs.grab("pk3", "g2")  # rebuilt from SQL first
    await redis.xadd(keys.packet_outbox("pk3"), {"type": "grab", "packet_id": "pk3"})
    await packets.writer.drain_all()  # the malformed record goes to the dead letters
    await packets.withdrawals.withdraw("pk3", "s1")  # packet_withdraw
    services.clock.advance(120)
    assert (await packets.sweeps.expire_due())["expired"] == 1
    await packets.sweeps.reindex()

    assert await services.ratelimit.take("grab", "key1", "g1") is not None  # ratelimit_take
    scheduler = build_scheduler(services)
    assert await scheduler.hold_lease()
    await scheduler.stop()

    assert {name for name, _ in calls} == set(script_names())
    for name, called_keys in calls:
        assert len({slot(k) for k in called_keys}) <= 1, (name, called_keys)
    # The dead letter went to the stream of its outbox's slot.
    assert await redis.xlen(keys.dead_letters(keys.packet_slot("pk3"))) == 1
    # Every slot that held something is in the directory.
    used = {keys.activity_slot("act1"), keys.packet_slot("pk1"), keys.packet_slot("pk3")}
    used |= {keys.sender_slot("s1"), keys.sender_slot("poor")}
    assert used <= set(await services.blocklist._slots.in_use())


# -- the jobs and the write-behind find work in every slot ----------------------------------


async def count_rows(services: Services, query: Any) -> int:
    async with services.database.sessions() as session:
        return int(await session.scalar(query) or 0)


async def events_of(services: Services, kind: str) -> int:
    return await count_rows(
        services, select(func.count()).select_from(EventRow).where(EventRow.type == kind)
    )


async def test_the_jobs_and_the_write_behind_reach_work_in_every_slot(
    cluster_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = cluster_services
    teams, packets, keys = services.teams, services.packets, services.keys

    async def sql_away(activity_id: str) -> None:
        """The flush a team call makes before answering fails: records wait in Redis."""

    monkeypatch.setattr(services.team_writer, "drain_quietly", sql_away)
    # Activities in 40 slots, and 5 more sharing one slot (more than a batch in one index).
    activities = ids_in_slots(keys.activity, "act", 40) + ids_in_one_slot(keys.activity, "x", 5)
    for activity_id in activities:
        await teams.activities.create_activity(
            activity_id, team_size=3, lock_ttl_s=60, team_deadline_s=120
        )
        await teams.activities.open_team(activity_id, "lead", team_id="locked")
        await teams.seats.lock(activity_id, "locked", "u1")
        await teams.activities.open_team(activity_id, "lead", team_id="late")
    packet_ids = ids_in_slots(keys.packet_outbox, "pk", 40) + ids_in_one_slot(
        keys.packet_outbox, "y", 5
    )
    await packets.accounts.deposit("sender", 10**9, "funds")
    for packet_id in packet_ids:
        await packets.sending.send("sender", 100, 2, packet_id=packet_id, expires_in_s=120)
        await packets.grabs.grab(packet_id, "g1")
    slots_used = {keys.activity_slot(a) for a in activities} | {
        keys.packet_slot(p) for p in packet_ids
    }
    assert len(slots_used) >= 70

    # The write-behind: every stream of every slot is listed, and drained.
    assert sorted(await services.team_writer.pending()) == sorted(activities)
    records, oldest_ms, streams = await packets.writer.measure_backlog()
    assert (records, streams) == (len(packet_ids), len(packet_ids)) and oldest_ms
    await services.jobs.run("flush_records")
    assert await services.team_writer.pending() == [] and await packets.writer.pending() == []
    members = select(func.count()).select_from(MemberRow)
    assert await count_rows(services, members) == 2 * len(activities)  # both leaders
    assert await count_rows(services, select(func.count()).select_from(GrabRow)) == len(packet_ids)

    # Batches of 2: several rounds over the slot that lists 5.
    services.clock.advance(61)
    assert (await teams.sweeps.expire_locks(batch=2))["locks_expired"] == len(activities)
    services.clock.advance(60)
    assert (await teams.sweeps.expire_due(batch=2))["teams_failed"] == 2 * len(activities)
    assert (await packets.sweeps.expire_due(batch=2))["expired"] == len(packet_ids)
    assert len(await services.team_writer.pending()) == len(activities)
    await services.jobs.run("flush_records")
    assert await events_of(services, "lock.expired") == len(activities)
    assert await events_of(services, "team.failed") == 2 * len(activities)
    assert await events_of(services, "packet.refunded") == len(packet_ids)
    failed = select(func.count()).select_from(TeamRow).where(TeamRow.status == "failed")
    assert await count_rows(services, failed) == 2 * len(activities)
    expired = select(func.count()).select_from(PacketRow).where(PacketRow.status == "expired")
    assert await count_rows(services, expired) == len(packet_ids)
    for number in await services.blocklist._slots.in_use():
        for index in keys.global_indexes(number):
            assert await services.redis.zcard(index) == 0, index


async def test_the_repair_job_lists_again_the_slots_a_lost_directory_held(
    cluster_services: Services,
) -> None:
    services = cluster_services
    teams, packets, keys = services.teams, services.packets, services.keys
    activities = ids_in_slots(keys.activity, "act", 10)
    for activity_id in activities:
        await teams.activities.create_activity(activity_id, team_size=3, lock_ttl_s=60)
        await teams.activities.open_team(activity_id, "lead", team_id="t1")
        await teams.seats.lock(activity_id, "t1", "u1")
    await packets.accounts.deposit("sender", 10**6, "funds")
    packet_ids = ids_in_slots(keys.packet_outbox, "pk", 10)
    for packet_id in packet_ids:
        await packets.sending.send("sender", 100, 2, packet_id=packet_id, expires_in_s=120)
    await services.redis.delete(keys.slot_directory())  # Redis lost it
    services.clock.advance(61)
    assert (await services.jobs.run("sweep_locks"))["locks_expired"] == 0  # nothing found

    await services.jobs.run("repair")

    assert (await services.jobs.run("sweep_locks"))["locks_expired"] == len(activities)
    services.clock.advance(60)
    assert (await services.jobs.run("expire_packets"))["expired"] == len(packet_ids)


# -- the blocklist ------------------------------------------------------------------------


async def refusals(services: Services, user: str, activity_id: str, packet_id: str) -> list[str]:
    """Which of the blocklist-checking calls refuse `user` (403 user_blocked)."""
    teams, packets = services.teams, services.packets
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "open": lambda: teams.activities.open_team(activity_id, user, team_id=f"{user}-own"),
        "lock": lambda: teams.seats.lock(activity_id, "t1", user),
        "join": lambda: teams.seats.join(activity_id, user),
        "confirm": lambda: teams.seats.confirm(activity_id, "t1", user, "o1"),
        "grab": lambda: packets.grabs.grab(packet_id, user),
        "send": lambda: packets.sending.send(user, 10, 1, packet_id=f"{user}-{packet_id}"),
    }
    refused: list[str] = []
    for name, call in calls.items():
        try:
            await call()
        except errors.UserBlocked:
            refused.append(name)
        except errors.GroupBuyError:
            pass
    return refused


ALL = ["open", "lock", "join", "confirm", "grab", "send"]


async def test_a_block_is_enforced_in_every_slot_before_and_after_it(
    cluster_services: Services,
) -> None:
    services = cluster_services
    teams, packets, keys = services.teams, services.packets, services.keys
    await packets.accounts.deposit("bad", 10**6, "bad-funds")
    await packets.accounts.deposit("sender", 10**6, "funds")

    async def make(activity_id: str, packet_id: str) -> None:
        await teams.activities.create_activity(activity_id, team_size=5)
        await teams.activities.open_team(activity_id, "lead", team_id="t1")
        await packets.sending.send("sender", 100, 5, packet_id=packet_id)

    def pairs(activity_prefix: str, packet_prefix: str) -> list[tuple[str, str]]:
        """Five (activity, packet) ids, each in a slot of its own."""
        activities = ids_in_slots(keys.activity, activity_prefix, 5)
        return list(
            zip(activities, ids_in_slots(keys.packet_outbox, packet_prefix, 5), strict=True)
        )

    early = pairs("a", "p")
    for activity_id, packet_id in early:
        await make(activity_id, packet_id)
    await services.blocklist.block("bad", "fraud")
    late = pairs("b", "q")
    for activity_id, packet_id in late:
        await make(activity_id, packet_id)

    for activity_id, packet_id in early + late:
        assert await refusals(services, "bad", activity_id, packet_id) == ALL
        assert await refusals(services, "good", activity_id, packet_id) == []
    # A slot's copy keeps only when the block began; the reason stays in the one hash.
    copy = keys.blocked_users(keys.activity_slot(late[0][0]))
    assert (await services.redis.hget(copy, "bad")).isdigit()

    await services.blocklist.unblock("bad")
    for activity_id, packet_id in early + late:
        assert await refusals(services, "bad", activity_id, packet_id) == []


async def test_a_block_racing_new_slots_reaches_every_one(cluster_services: Services) -> None:
    import asyncio

    services = cluster_services
    teams, keys = services.teams, services.keys
    activities = ids_in_slots(keys.activity, "r", 30)

    async def create_all() -> None:
        for activity_id in activities:
            await teams.activities.create_activity(activity_id, team_size=5)

    await asyncio.gather(create_all(), services.blocklist.block("bad"), create_all())
    for activity_id in activities:
        await teams.activities.open_team(activity_id, "lead", team_id="t1")
        with pytest.raises(errors.UserBlocked):
            await teams.seats.lock(activity_id, "t1", "bad")


async def test_sync_rebuilds_a_slot_copy_redis_lost(cluster_services: Services) -> None:
    services = cluster_services
    teams, keys = services.teams, services.keys
    await teams.activities.create_activity("a1", team_size=5)
    await teams.activities.open_team("a1", "lead", team_id="t1")
    await services.blocklist.block("bad")
    await services.blocklist.block("worse")
    await services.redis.delete(keys.activity_blocklist("a1"))
    assert (await teams.seats.lock("a1", "t1", "bad")).created  # the copy is gone: not refused

    report = await services.blocklist.sync()

    assert report == {"blocked_users": 2, "blocklist_rebuilt": 1}
    with pytest.raises(errors.UserBlocked):
        await teams.seats.lock("a1", "t1", "worse")
    assert (await services.blocklist.sync())["blocklist_rebuilt"] == 0
