"""Start and stop a private Redis Cluster on loopback ports (tests and benchmarks).

`start_cluster(masters=3)` starts that many cluster-enabled servers (the binary
tests/support/servers.py finds), each in its own temporary directory on a free port,
gives each an even share of the 16,384 slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER
MEET) and waits until every node says `cluster_state:ok`. Everything is done with plain
commands from Python, so no redis-cli is needed. `stop()` kills every server by PID and
removes its directory.

`start_cluster(masters=3, replicas=1)` gives each master that many replicas (CLUSTER
REPLICATE) for failover tests: `kill(index)` is a kill -9 of one node, `wait_for_promotion`
waits until a replica serves its slots, and `restart(index)` starts it again on its port,
bus port and directory (its nodes.conf), where it rejoins as a replica of the promoted node.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from tests.support.servers import RedisProcess, free_port, start_redis

SLOTS = 16_384
# Short enough that a test killing a node sees it failed within seconds.
NODE_TIMEOUT_MS = 2000
# A cluster needs ~1-3 s to agree after the last MEET; this bounds a broken start.
READY_TIMEOUT_S = 30.0
# A replica's full sync starts at once (the default waits 5 s for more replicas to share it).
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The (first, last) slots each master serves: an even split, in order."""
    bounds = [SLOTS * index // masters for index in range(masters + 1)]
    return [(bounds[index], bounds[index + 1] - 1) for index in range(masters)]


@dataclass
class RedisCluster:
    """The servers of a cluster we started; `url` names one live node (a client finds the
    rest). A node keeps its index in `nodes` while it is killed and after its restart."""

    nodes: list[RedisProcess] = field(default_factory=list)
    bus_ports: list[int] = field(default_factory=list)  # each node's cluster bus
    extra: tuple[str, ...] = ()  # more server arguments, given to every node
    killed: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # index -> its slots

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[self.alive()[0]].port}/0"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def client(self, index: int) -> redis.Redis:
        """A plain (non-cluster) client on one node, for commands meant for that node only."""
        return redis.Redis(port=self.nodes[index].port, decode_responses=True, socket_timeout=5)

    def alive(self) -> list[int]:
        """The indexes of the nodes not killed (or started again since)."""
        return [index for index in range(len(self.nodes)) if index not in self.killed]

    def slot_owners(self, index: int | None = None) -> list[tuple[int, int, int]]:
        """(first, last, master's index) of every slot range, as node `index` (by default the
        first live one) sees it."""
        with self.client(self.alive()[0] if index is None else index) as client:
            return [
                (int(first), int(last), self.ports.index(int(port)))
                for first, last, (_host, port, *_rest), *_replicas in client.execute_command(
                    "CLUSTER", "SLOTS"
                )
            ]

    def node_of_slot(self, slot: int) -> int:
        """The index in `nodes` of the master serving `slot` right now."""
        for first, last, owner in self.slot_owners():
            if first <= slot <= last:
                return owner
        raise LookupError(f"no node serves slot {slot}")

    def masters(self) -> list[int]:
        """The indexes of the nodes serving slots right now."""
        return sorted({owner for _first, _last, owner in self.slot_owners()})

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
            for index in self.alive():
                with self.client(index) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self._wait_until_agreed()

    def kill(self, index: int) -> None:
        """kill -9 of one node: nothing is flushed, its connections drop at once."""
        served = [(first, last) for first, last, owner in self.slot_owners() if owner == index]
        node = self.nodes[index]
        node.process.kill()
        node.process.wait()
        self.killed[index] = served

    def wait_for_promotion(self, index: int, timeout_s: float = 30) -> int:
        """Until every live node names one live master for the slots the killed node `index`
        served and says `cluster_state:ok`; returns that master's index."""
        wanted = self.killed[index]
        deadline = time.monotonic() + timeout_s
        while True:
            owners: set[int] = set()
            for alive in self.alive():
                owners |= {
                    owner
                    for first, last, owner in self.slot_owners(alive)
                    for slot, _last in wanted
                    if first <= slot <= last
                }
                with self.client(alive) as client:
                    if "cluster_state:ok" not in str(client.execute_command("CLUSTER", "INFO")):
                        owners.add(index)  # this node has not settled yet
            if len(owners) == 1 and index not in owners:
                return owners.pop()
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {index}'s slots not taken over within {timeout_s} s")
            time.sleep(0.05)

    def restart(self, index: int) -> None:
        """Start a killed node again on its port, bus port and data (nodes.conf included): it
        rejoins the cluster and finds its slots served by its promoted replica."""
        dead = self.nodes[index]
        node = _start_node(self.bus_ports[index], self.extra, dead.port, dead)
        self.nodes[index] = node
        del self.killed[index]

    def wait_until_replica(self, index: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until node `index` is a replica whose link to its master is up, and every node says
        the cluster is whole again."""
        _wait_for_link(self, index, timeout_s)
        self._wait_until_agreed()

    def _wait_until_agreed(self) -> None:
        """Wait until every live node reports the cluster healthy and knows every node."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            states = []
            for index in self.alive():
                with self.client(index) as node:
                    info = str(node.execute_command("CLUSTER", "INFO"))
                states.append(
                    "cluster_state:ok" in info
                    and f"cluster_known_nodes:{len(self.nodes)}" in info
                    and f"cluster_slots_ok:{SLOTS}" in info
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


def _start_node(
    bus_port: int, extra: Sequence[str], port: int | None = None, dead: RedisProcess | None = None
) -> RedisProcess:
    """One cluster-enabled server (again on a dead one's port and directory when given)."""
    node = start_redis(
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        str(NODE_TIMEOUT_MS),
        "--cluster-port",
        str(bus_port),
        *SYNC_AT_ONCE,
        *extra,
        port=port,
        directory=None if dead is None else dead.directory,
    )
    if dead is not None:
        node.owns_directory = dead.owns_directory
    return node


def _wait_for_link(cluster: RedisCluster, index: int, timeout_s: float) -> None:
    """Until node `index` is a replica whose link to its master is up (synced)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with cluster.client(index) as client:
            info = client.info("replication")
        if info.get("role") == "slave" and info.get("master_link_status") == "up":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {index} is not a synced replica: {info}")
        time.sleep(0.05)


def start_cluster(masters: int = 3, replicas: int = 0, extra: Sequence[str] = ()) -> RedisCluster:
    """Start `masters` cluster-enabled servers, give them the slots, join them, give each
    master `replicas` replicas, and wait for `cluster_state:ok` on every node (`extra`: more
    server arguments for every node, persistence for instance). Stops what it started if
    the cluster does not form."""
    if masters < 1:
        raise ValueError("a cluster needs at least one master")
    cluster = RedisCluster(extra=tuple(extra))
    try:
        for _ in range(masters * (1 + replicas)):
            # The bus port defaults to port + 10000, past 65535 for a high free port.
            cluster.bus_ports.append(free_port())
            cluster.nodes.append(_start_node(cluster.bus_ports[-1], cluster.extra))
        for index, (first, last) in enumerate(slot_ranges(masters)):
            with cluster.client(index) as node:
                # Distinct epochs up front: no collision for the nodes to settle first.
                node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        with cluster.client(0) as first_node:
            for port, bus_port in zip(cluster.ports[1:], cluster.bus_ports[1:], strict=True):
                first_node.execute_command("CLUSTER", "MEET", "127.0.0.1", port, bus_port)
        cluster._wait_until_agreed()
        for index in range(masters, len(cluster.nodes)):
            _replicate(cluster, index, master=(index - masters) % masters)
        for index in range(masters, len(cluster.nodes)):
            _wait_for_link(cluster, index, READY_TIMEOUT_S)
        cluster._wait_until_agreed()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _replicate(cluster: RedisCluster, index: int, master: int) -> None:
    """Make node `index` a replica of node `master` (once it has heard of it by gossip)."""
    with cluster.client(master) as node:
        master_id = str(node.execute_command("CLUSTER", "MYID"))
    deadline = time.monotonic() + READY_TIMEOUT_S
    with cluster.client(index) as node:
        while True:
            try:
                node.execute_command("CLUSTER", "REPLICATE", master_id)
                return
            except redis.ResponseError:  # "Unknown node" until gossip brings it
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
