"""Start and stop a private Redis Cluster on loopback ports (tests and benchmarks).

`start_cluster(masters=3)` starts that many cluster-enabled servers (the binary
groupbuy/testing/servers.py finds), each in its own temporary directory on a free port,
gives each an even share of the 16,384 slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER
MEET) and waits until every node says `cluster_state:ok`. Everything is done with plain
commands from Python, so no redis-cli is needed. `stop()` kills every server by PID and
removes its directory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from groupbuy.testing.servers import RedisProcess, free_port, start_redis

SLOTS = 16_384
# Short enough that a test killing a node sees it failed within seconds.
NODE_TIMEOUT_MS = 2000
# A cluster needs ~1-3 s to agree after the last MEET; this bounds a broken start.
READY_TIMEOUT_S = 30.0


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The (first, last) slots each master serves: an even split, in order."""
    bounds = [SLOTS * index // masters for index in range(masters + 1)]
    return [(bounds[index], bounds[index + 1] - 1) for index in range(masters)]


@dataclass
class RedisCluster:
    """The servers of a cluster we started; `url` names one node (a client finds the rest)."""

    nodes: list[RedisProcess] = field(default_factory=list)
    bus_ports: list[int] = field(default_factory=list)  # each node's cluster bus

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def client(self, index: int) -> redis.Redis:
        """A plain (non-cluster) client on one node, for commands meant for that node only."""
        return redis.Redis(port=self.nodes[index].port, decode_responses=True)

    def node_of_slot(self, slot: int) -> int:
        """The index in `nodes` of the master serving `slot` right now."""
        with self.client(0) as client:
            for first, last, (_host, port, *_rest), *_replicas in client.execute_command(
                "CLUSTER", "SLOTS"
            ):
                if int(first) <= slot <= int(last):
                    return self.ports.index(int(port))
        raise LookupError(f"no node serves slot {slot}")

    def move_slot(self, slot: int, target: int) -> None:
        """Move one slot, with its keys, to the master `nodes[target]` (a resharding by hand:
        SETSLOT IMPORTING/MIGRATING, MIGRATE of each key, then SETSLOT NODE everywhere)."""
        source = self.node_of_slot(slot)
        if source == target:
            return
        with self.client(source) as src, self.client(target) as dst:
            src_id = str(src.execute_command("CLUSTER", "MYID"))
            dst_id = str(dst.execute_command("CLUSTER", "MYID"))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                src.execute_command(
                    "MIGRATE", "127.0.0.1", self.nodes[target].port, "", 0, 5000, "KEYS", *keys
                )
            for index in range(len(self.nodes)):
                with self.client(index) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self._wait_until_agreed()

    def _wait_until_agreed(self) -> None:
        """Wait until every node reports the cluster healthy and knows every other node."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            states = []
            for index in range(len(self.nodes)):
                with self.client(index) as node:
                    info = node.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                states.append(
                    "cluster_state:ok" in text
                    and f"cluster_known_nodes:{len(self.nodes)}" in text
                    and f"cluster_slots_ok:{SLOTS}" in text
                )
            if all(states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster on ports {self.ports} did not become ready")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill every server (by PID) and remove their directories."""
        for node in self.nodes:
            node.stop()
        self.nodes.clear()


def start_cluster(masters: int = 3) -> RedisCluster:
    """Start `masters` cluster-enabled servers, give them the slots, join them, and wait for
    `cluster_state:ok` on every node. Stops what it started if the cluster does not form."""
    if masters < 1:
        raise ValueError("a cluster needs at least one master")
    cluster = RedisCluster()
    try:
        for _ in range(masters):
            # The bus port defaults to port + 10000, past 65535 for a high free port.
            cluster.bus_ports.append(free_port())
            cluster.nodes.append(
                start_redis(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--cluster-port",
                    str(cluster.bus_ports[-1]),
                )
            )
        for index, (first, last) in enumerate(slot_ranges(masters)):
            with cluster.client(index) as node:
                # Distinct epochs up front: no collision for the nodes to settle first.
                node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        with cluster.client(0) as first_node:
            for port, bus_port in zip(cluster.ports[1:], cluster.bus_ports[1:], strict=True):
                first_node.execute_command("CLUSTER", "MEET", "127.0.0.1", port, bus_port)
        cluster._wait_until_agreed()
    except BaseException:
        cluster.stop()
        raise
    return cluster
