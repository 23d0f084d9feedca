"""On a 3-master Redis Cluster, activities and packets land on every shard, and every one of
them works wherever it landed: seats locked and confirmed, shares grabbed, records in SQL."""

from __future__ import annotations

from collections import Counter

import pytest
import redis
from sqlalchemy import func, select

from groupbuy import errors
from groupbuy.locks.models import TeamRow
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services
from tests.support.backends import CLUSTER

pytestmark = pytest.mark.parametrize("backend", [CLUSTER])

ACTIVITIES = 24
PACKETS = 24


def shard_counts(url: str, pattern: str) -> Counter[str]:
    """How many keys matching `pattern` each primary holds, by node name."""
    with redis.RedisCluster.from_url(url, decode_responses=True) as client:
        return Counter(
            {
                node.name: len(client.keys(pattern, target_nodes=node))
                for node in client.get_primaries()
            }
        )


async def test_activities_and_packets_spread_over_every_shard_and_all_work(
    services: Services, redis_url: str
) -> None:
    teams, packets = services.teams, services.packets
    await packets.accounts.deposit("sender", PACKETS * 300, "funding")
    for n in range(ACTIVITIES):
        aid = f"act{n}"
        await teams.activities.create_activity(aid, team_size=2)
        await teams.activities.open_team(aid, f"lead{n}", team_id="t")
        await teams.seats.lock(aid, "t", f"joiner{n}")
        await teams.seats.confirm(aid, "t", f"joiner{n}", f"order{n}")
    for n in range(PACKETS):
        await packets.sending.send("sender", 300, 3, packet_id=f"pk{n}")
        for user in range(3):
            await packets.grabs.grab(f"pk{n}", f"grabber{user}")
        with pytest.raises(errors.SoldOut):
            await packets.grabs.grab(f"pk{n}", "grabber3")

    activity_shards = shard_counts(redis_url, f"{services.keys.prefix}:{{a:*:activity")
    packet_shards = shard_counts(redis_url, f"{services.keys.prefix}:{{p:*:packet")
    assert len(activity_shards) == 3 and all(activity_shards.values()), activity_shards
    assert sum(activity_shards.values()) == ACTIVITIES
    assert len(packet_shards) == 3 and all(packet_shards.values()), packet_shards
    assert sum(packet_shards.values()) == PACKETS

    for n in range(ACTIVITIES):
        team = await teams.activities.get_team(f"act{n}", "t")
        assert team["status"] == "formed" and not team["locks"], team
    # The write-behind finds the work of every shard (both flush jobs' own calls).
    await services.team_writer.drain_all()
    await services.packets.writer.drain_all()
    async with services.database.sessions() as session:
        grabs = await session.scalar(select(func.count()).select_from(GrabRow))
        formed = await session.scalar(select(func.count()).select_from(TeamRow))
    assert grabs == PACKETS * 3  # three shares each, the fourth grabber sold out
    assert formed == ACTIVITIES
