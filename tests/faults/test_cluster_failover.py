"""kill -9 of one Redis Cluster master mid-storm: 3 masters with a replica each, PostgreSQL.
The replica is promoted within seconds and the killed node comes back as its replica,
while the storm goes on through uvicorn. The node killed is the one serving the API key's
rate-limit bucket, the worst case.

What must hold with either `cluster-require-full-coverage`: no 500 and no dropped
connection (a fault is a 503); every `grabbed` answer ends as one grab row and one credit,
money is conserved and reconciliation finds nothing. With `no`, the other shards go on at
their rate, with no 503, while the killed one's slots wait for the promotion. With `yes`
(Redis's default) every shard answers CLUSTERDOWN from the moment the cluster marks the
primary failed until the promotion: 503s, as docs/deploy.md says. The old code answered
500 here (5 and 73 in one run of each, 64 callers) and let the healthy shards' rate fall
to 8-30% of what it was.

The storm's callers each work one lane (one packet, or the activity's joins), as separate
clients would, so that the rate of the healthy shards' lanes measures the service and not
callers waiting on the dead shard. There is one packet per master.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from redis.crc import key_slot

from groupbuy.api.access import fingerprint
from groupbuy.storage.keys import Keys
from tests.support.database import TestDatabases
from tests.support.http import ADMIN, SERVICE_KEY
from tests.support.redis_cluster import RedisCluster, start_cluster
from tests.support.storm import (
    DEFINITIVE,
    PERSIST,
    Figures,
    Storm,
    check_after_storm,
    served_app,
    storm_settings,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.postgres]

NOEVICTION = ("--maxmemory-policy", "noeviction")
# Set, so the test knows the name of the service key's rate-limit bucket before it starts.
FINGERPRINT_SECRET = "fingerprint-secret-of-the-failover"
# How long the storm runs before the kill: the window the outage's rate is compared with.
BEFORE_S = 4.0
# The healthy shards' answers per second during the outage, at least this share of before.
# Generous for a loaded 2-core machine; the rate-limit shard's loss throttling the others
# gave 8-30% here (and ~2% in the run).
KEPT_RATE = 0.5
# Once the replica is promoted, every shard answers again within this.
SETTLED_S = 2.0


@dataclass
class Failover:
    """What a storm through a failover measured."""

    storm: Storm
    figures: Figures
    healthy: set[str]  # the lanes of the packets on the shards not killed
    killed_at: float
    promoted_at: float

    def rates(self) -> tuple[float, float]:
        """The healthy lanes' definitive answers per second before the kill and between the
        kill and the promotion."""
        return _rates(self.storm, self.healthy, self.killed_at, self.promoted_at)

    def healthy_refused(self) -> list[tuple[float, str, str]]:
        """The healthy lanes' answers other than definitive ones from the kill on (seconds
        after the kill, lane, answer)."""
        return _refused(self.storm, self.healthy, self.killed_at)


def _rates(
    storm: Storm, lanes: set[str], killed_at: float, promoted_at: float
) -> tuple[float, float]:
    # As long before the kill as the outage lasted (the storm ran BEFORE_S before it).
    window_s = min(promoted_at - killed_at, BEFORE_S)
    return (
        _answers_per_s(storm, lanes, killed_at - window_s, killed_at),
        _answers_per_s(storm, lanes, killed_at, promoted_at),
    )


def _answers_per_s(storm: Storm, lanes: set[str], start: float, end: float) -> float:
    answered = sum(
        1
        for when, lane, outcome in storm.timeline
        if lane in lanes and start <= when < end and outcome in DEFINITIVE
    )
    return answered / (end - start)


def _refused(storm: Storm, lanes: set[str], since: float) -> list[tuple[float, str, str]]:
    return [
        (round(when - since, 2), lane, outcome)
        for when, lane, outcome in storm.timeline
        if lane in lanes and when >= since and outcome not in DEFINITIVE
    ]


def one_packet_per_master(cluster: RedisCluster, keys: Keys) -> dict[int, str]:
    """A packet id for each master, by the master's index."""
    chosen: dict[int, str] = {}
    for n in range(1000):
        packet_id = f"pk{n}"
        owner = cluster.node_of_slot(key_slot(keys.packet_keys(packet_id).hash.encode()))
        chosen.setdefault(owner, packet_id)
        if len(chosen) == len(cluster.masters()):
            return chosen
    raise LookupError(f"no packet id found for every master: {chosen}")


async def storm_through_a_failover(
    full_coverage: str, databases: TestDatabases, name: str
) -> Failover:
    """Start the cluster, storm, kill -9 the master of the rate-limit bucket, wait for the
    promotion, restart the killed node, wait until it is a replica, storm on; then stop,
    check (tests/support/storm.py) and reconcile."""
    extra = (*PERSIST, *NOEVICTION, "--cluster-require-full-coverage", full_coverage)
    cluster = await asyncio.to_thread(start_cluster, 3, 1, extra)
    try:
        settings = storm_settings(
            cluster.url,
            databases.shared_empty(),
            GROUPBUY_REDIS_CLUSTER="true",
            GROUPBUY_AUTH_FINGERPRINT_SECRET=FINGERPRINT_SECRET,
        )
        keys = Keys(settings.redis.key_prefix, cluster=True)
        key_id = fingerprint(SERVICE_KEY, FINGERPRINT_SECRET.encode())
        rate_bucket = keys.rate_buckets(key_id, "grab", None)[0]
        victim = cluster.node_of_slot(key_slot(rate_bucket.encode()))
        packets = one_packet_per_master(cluster, keys)
        healthy = {packet_id for owner, packet_id in packets.items() if owner != victim}
        async with served_app(settings) as (app, client):
            storm = Storm(
                client,
                packet_names=tuple(packets.values()),
                shares=5000,
                callers=64,  # as in the issue: fewer left the 500s unseen
                rate=3000,  # more than the machine serves: each caller waits for its answers
                lanes=True,
            )
            await storm.prepare()
            storm.start()
            started = time.monotonic()
            await storm.wait_calls(200)
            await asyncio.sleep(max(0.0, BEFORE_S - (time.monotonic() - started)))
            cluster.kill(victim)
            killed_at = time.monotonic()
            promoted = await asyncio.to_thread(cluster.wait_for_promotion, victim)
            promoted_at = time.monotonic()
            await asyncio.to_thread(cluster.restart, victim)
            await asyncio.to_thread(cluster.wait_until_replica, victim)
            rejoined_at = time.monotonic()
            await storm.wait_calls(storm.calls + 600)
            await storm.stop()
            outage_s = promoted_at - killed_at
            before, during = _rates(storm, healthy, killed_at, promoted_at)
            figures = await check_after_storm(
                name,
                storm,
                app,
                client,
                victim=victim,
                promoted=promoted,
                promoted_s=round(outage_s, 2),
                rejoined_s=round(rejoined_at - killed_at, 2),
                healthy_per_s_before=round(before),
                healthy_per_s_during=round(during),
                healthy_refused=len(_refused(storm, healthy, killed_at)),
            )
            report = (await client.post("/v1/admin/jobs/reconcile/run", headers=ADMIN)).json()
        assert report["mismatch_count"] == 0, report
        return Failover(storm, figures, healthy, killed_at, promoted_at)
    finally:
        cluster.stop()


async def test_kill_9_of_a_master_leaves_the_other_shards_at_their_rate_without_a_500(
    test_databases: TestDatabases,
) -> None:
    failover = await storm_through_a_failover("no", test_databases, "cluster master killed")
    before, during = failover.rates()
    assert not failover.healthy_refused(), failover.healthy_refused()[:10]
    assert during >= KEPT_RATE * before, (before, during, failover.figures)
    # The killed shard was felt: its lane's calls answered 503 until the promotion.
    assert failover.figures.answers.get("503 redis_unavailable", 0) > 0, failover.figures


async def test_with_full_coverage_the_other_shards_answer_503_not_500_until_the_promotion(
    test_databases: TestDatabases,
) -> None:
    """How many of the healthy shards' calls meet CLUSTERDOWN depends on how long the cluster
    stays down between marking the primary failed and the promotion (0 to 33 in the runs
    seen); tests/storage/test_cluster_coverage.py shows the state itself. Here: whatever
    meets it is a 503, and only until the promotion."""
    failover = await storm_through_a_failover(
        "yes", test_databases, "cluster master killed, full coverage"
    )
    refused = failover.healthy_refused()
    assert {outcome for _when, _lane, outcome in refused} <= {"503 redis_unavailable"}, refused
    outage_s = failover.promoted_at - failover.killed_at
    assert all(when <= outage_s + SETTLED_S for when, *_ in refused), (outage_s, refused)
