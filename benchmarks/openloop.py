"""An open-loop HTTP load generator: requests at a fixed rate, latency from when each was due
(docs/benchmarking.md says why, how it measures itself, and its modes).

Usage: python -m benchmarks.openloop URL RATE SECONDS CONNECTIONS TAG MODE KEY ARG...
prints one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httptools

from benchmarks.harness import percentile
from groupbuy.redpacket.codec import grab_credit_key

SAMPLE = 2000  # latencies kept for the plot
KEPT_UP_RATE = 0.95
ON_TIME_LATE_MS = 5.0
DRAIN_TIMEOUT_S = 30.0
CONFIRM_AFTER_S = 0.030  # from a lock's answer to its confirm (mixed mode)


def post(key: str, path: str, body: str) -> bytes:
    """One POST of a JSON body as bytes (HTTP/1.1, keep-alive)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def request_builder(mode: str, key: str, tag: str, params: list[str]) -> Callable[[int], bytes]:
    """Request i of a run as bytes (HTTP/1.1, keep-alive)."""

    def build(path: str, user: str) -> bytes:
        return post(key, path, f'{{"user_id":"{user}"}}')

    if mode == "grab":
        packets = params

        def grab(i: int) -> bytes:
            n = i - 1 if i % 20 == 19 else i  # a double tap: the previous request again
            return build(f"/v1/redpackets/{packets[n % len(packets)]}/grab", f"o{tag}-{n}")

        return grab
    if mode == "lock":
        activity, teams = params[0], int(params[1])

        def lock(i: int) -> bytes:
            path = f"/v1/activities/{activity}/teams/t{i % teams + 1}/locks"
            return build(path, f"o{tag}-{i}")

        return lock
    raise ValueError(f"unknown mode {mode!r}")


@dataclass(frozen=True)
class Mix:
    """Several kinds of request in one schedule, and follow-ups due some time after an
    answer: `kind(i)` names request i's kind, `follow(i, status)` is the request (kind,
    bytes) to send `after_s` after request i was answered with `status`, or None;
    `credit(i)` is the ledger's business key of grab i's credit."""

    kind: Callable[[int], str]
    follow: Callable[[int, int], tuple[str, bytes] | None]
    after_s: float
    credit: Callable[[int], str]


def mixed_workload(key: str, tag: str, params: list[str]) -> tuple[Callable[[int], bytes], Mix]:
    """Mixed mode: request i is a grab unless i % 3 == 2, a seat lock; a lock answered 201
    is confirmed CONFIRM_AFTER_S later (order id = the user's)."""
    activity, activities, teams, packets = params[0], int(params[1]), int(params[2]), params[3:]

    def team_path(i: int) -> tuple[str, str]:
        n = i // 3  # the n-th lock
        a, t = n % activities + 1, (n // activities) % teams + 1
        return f"/v1/activities/{activity}-{a}/teams/t{t}", f"m{tag}-{i}"

    def grab(i: int) -> tuple[str, str]:
        g = i // 3 * 2 + i % 3  # the g-th grab: a new user, round-robin over the packets
        return packets[g % len(packets)], f"g{tag}-{g}"

    def build(i: int) -> bytes:
        if i % 3 != 2:
            packet, user = grab(i)
            return post(key, f"/v1/redpackets/{packet}/grab", f'{{"user_id":"{user}"}}')
        path, user = team_path(i)
        return post(key, f"{path}/locks", f'{{"user_id":"{user}"}}')

    def follow(i: int, status: int) -> tuple[str, bytes] | None:
        if i % 3 != 2 or status != 201:
            return None
        path, user = team_path(i)
        return "confirm", post(
            key, f"{path}/members", f'{{"user_id":"{user}","order_id":"{user}"}}'
        )

    def kind(i: int) -> str:
        return "lock" if i % 3 == 2 else "grab"

    return build, Mix(kind, follow, CONFIRM_AFTER_S, lambda i: grab_credit_key(*grab(i)))


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, on_answer: Callable[[Connection, int, bytes], None]) -> None:
        self.on_answer = on_answer
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.body = bytearray()
        self.busy = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        status, body = self.parser.get_status_code(), bytes(self.body)
        self.body.clear()
        self.busy = False
        self.on_answer(self, status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, data: bytes) -> None:
        """Write one request (the answer arrives through on_answer)."""
        assert self.transport is not None
        self.busy = True
        self.transport.write(data)


async def run(
    url: str,
    rate: float,
    seconds: float,
    connections: int,
    build: Callable[[int], bytes],
    mix: Mix | None = None,
) -> dict[str, Any]:
    """Offer rate x seconds requests on `connections` connections (and, with a `mix`, the
    follow-ups their answers call for); what happened."""
    loop = asyncio.get_running_loop()
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    total = max(1, int(rate * seconds))
    interval = 1.0 / rate
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {}
    kind_statuses: dict[str, Counter[str]] = {}
    late: list[float] = []
    statuses: Counter[str] = Counter()
    bodies: Counter[str] = Counter()
    credits_due: dict[str, float] = {}  # (mix) a grabbed grab's credit key: when answered
    # due, waiting for a free connection: (index, due, kind, request or None to build)
    pending: deque[tuple[int, float, str, bytes | None]] = deque()
    in_flight: dict[Connection, tuple[int, float, str]] = {}
    free: list[Connection] = []
    waited = 0
    done = loop.create_future()
    answered = 0
    expected = total  # grows by each follow-up an answer calls for

    def dispatch() -> None:
        while pending and free:
            conn = free.pop()
            index, due, kind, data = pending.popleft()
            in_flight[conn] = (index, due, kind)
            conn.send(build(index) if data is None else data)

    def follow_up(kind: str, data: bytes, due: float) -> None:
        pending.append((-1, due, kind, data))
        dispatch()

    def on_answer(conn: Connection, status: int, body: bytes) -> None:
        nonlocal answered, expected
        index, due, kind = in_flight.pop(conn)
        latency = time.perf_counter() - due
        latencies.append(latency)
        statuses[str(status)] += 1
        if mix is not None:
            by_kind.setdefault(kind, []).append(latency)
            kind_statuses.setdefault(kind, Counter())[str(status)] += 1
            then = mix.follow(index, status) if index >= 0 else None
            if then is not None:
                expected += 1
                at = time.perf_counter() + mix.after_s
                loop.call_later(mix.after_s, follow_up, then[0], then[1], at)
        if b'"grabbed"' in body:
            bodies["grabbed"] += 1
            if mix is not None and index >= 0:
                credits_due[mix.credit(index)] = due + latency  # answered
        elif b'"already_grabbed"' in body:
            bodies["already"] += 1
        answered += 1
        free.append(conn)
        dispatch()
        if answered == expected and not done.done():
            done.set_result(None)

    conns = []
    for _ in range(connections):
        _transport, conn = await loop.create_connection(lambda: Connection(on_answer), host, port)
        conns.append(conn)
    free.extend(conns)
    cpu_began = time.process_time()
    start = time.perf_counter() + 0.01
    index = 0
    while index < total:
        now = time.perf_counter()
        while index < total and start + index * interval <= now:
            due = start + index * interval
            late.append(now - due)
            waited += not free
            pending.append((index, due, mix.kind(index) if mix else "", None))
            index += 1
        dispatch()
        if index < total:
            wait = start + index * interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
    issue_seconds = max(time.perf_counter() - start, (total - 1) * interval)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, DRAIN_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_began
    lost = sum(1 for c in conns if c.closed.done())
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    late.sort()
    issued_per_s = total / issue_seconds if issue_seconds > 0 else 0.0
    late_p99 = percentile(late, 0.99) or 0.0
    kept_up = issued_per_s >= KEPT_UP_RATE * rate
    result: dict[str, Any] = {
        "requests": expected,
        "answered": answered,
        "unanswered": expected - answered,
        "connections_lost": lost,
        "offered_per_s": round(rate, 1),
        "issued_per_s": round(issued_per_s, 1),
        "seconds": round(elapsed, 3),
        **_summary(sorted(latencies), statuses),
        "issue_late_p50_ms": percentile(late, 0.50),
        "issue_late_p99_ms": late_p99,
        "waited_for_connection": waited,
        "generator_cpu_share": round(cpu / elapsed, 3) if elapsed > 0 else None,
        "generator_kept_up": kept_up,
        "generator_on_time": late_p99 <= ON_TIME_LATE_MS,
        "grabbed": bodies["grabbed"],
        "already": bodies["already"],
    }
    if mix is not None:
        result["by_kind"] = {kind: _summary(sorted(values), kind_statuses[kind])
                             for kind, values in sorted(by_kind.items())}  # fmt: skip
        # perf_counter is the system's monotonic clock: another process can compare.
        result["credits_due"] = credits_due
    return result


def _summary(ordered: list[float], statuses: Counter[str]) -> dict[str, Any]:
    """Count, statuses, percentiles and a (sorted) latency sample of requests."""
    sample = ordered if len(ordered) <= SAMPLE else sorted(random.sample(ordered, SAMPLE))
    return {
        "count": len(ordered),
        "statuses": dict(statuses),
        "p50_ms": percentile(ordered, 0.50),
        "p95_ms": percentile(ordered, 0.95),
        "p99_ms": percentile(ordered, 0.99),
        "max_ms": round(ordered[-1] * 1000, 3) if ordered else None,
        "latencies_ms": [round(s * 1000, 3) for s in sample],
    }


def main(argv: list[str]) -> None:
    """Parse the command line, run, print the JSON result."""
    url, rate, seconds, connections, tag, mode, key, *params = argv
    mix = None
    if mode == "mixed":
        build, mix = mixed_workload(key, tag, params)
    else:
        build = request_builder(mode, key, tag, params)
    result = asyncio.run(run(url, float(rate), float(seconds), int(connections), build, mix))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
