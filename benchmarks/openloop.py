"""An open-loop HTTP load generator: requests at a fixed rate, latency from when each was due.

wrk keeps a fixed number of requests in flight (a closed loop): when the server slows
down, wrk sends less, and the waiting it no longer does is missing from its percentiles
(coordinated omission). wrk2, which fixes that, is not packaged here, so this is the
benchmark's own: request i is *due* at start + i / rate whatever the answers do, goes out
on the first free keep-alive connection (of `connections`, opened beforehand), and its
latency is counted from when it was due, so time queued behind slow answers counts.

One process, the standard asyncio loop (its timers wake the dispatcher at most every
millisecond; requests that fell due meanwhile leave together, and that delay counts in
their latency), raw sockets and httptools to read the answers. It measures itself: the
rate at which it actually issued requests, how late it noticed them against their due
time, and its CPU time. `generator_kept_up` is false when it issued under 95% of the rate
asked (the server then saw less load than the row says); `generator_on_time` is false when
it noticed requests more than 5 ms late at the 99th percentile (short of CPU on a busy
machine: that delay is in the latency, so the figures are worse, never better, for it).
The rows say both.

Modes (what benchmarks/http_level.py drives; the bodies match benchmarks/wrk/post.lua):
  grab KEY PACKET...      POST /v1/redpackets/<id>/grab, a new user per request, round-robin
                          over the packets, every 20th request repeating the previous one
  lock KEY ACTIVITY TEAMS POST /v1/activities/<a>/teams/t<k>/locks, a new user per request,
                          round-robin over teams t1..tTEAMS
  join KEY ACTIVITY       POST /v1/activities/<a>/locks ("join any team"), a new user per request
  bare KEY                POST /grab (benchmarks/bare_app.py), a new user per request
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
from typing import Any
from urllib.parse import urlparse

import httptools

from benchmarks.measure import percentile

SAMPLE = 2000  # latencies kept for the plot
KEPT_UP_RATE = 0.95
ON_TIME_LATE_MS = 5.0
DRAIN_TIMEOUT_S = 30.0


def request_builder(mode: str, key: str, tag: str, params: list[str]) -> Callable[[int], bytes]:
    """Request i of a run as bytes (HTTP/1.1, keep-alive)."""
    head = (
        "POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer " + key + "\r\n"
        "Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )

    def build(path: str, user: str) -> bytes:
        body = f'{{"user_id":"{user}"}}'
        return (head.format(path=path, length=len(body)) + body).encode()

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
    if mode == "join":
        return lambda i: build(f"/v1/activities/{params[0]}/locks", f"o{tag}-{i}")
    if mode == "bare":
        return lambda i: build("/grab", f"o{tag}-{i}")
    raise ValueError(f"unknown mode {mode!r}")


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
) -> dict[str, Any]:
    """Offer rate x seconds requests on `connections` connections; what happened."""
    loop = asyncio.get_running_loop()
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    total = max(1, int(rate * seconds))
    interval = 1.0 / rate
    latencies: list[float] = []
    late: list[float] = []
    statuses: Counter[str] = Counter()
    bodies: Counter[str] = Counter()
    pending: deque[tuple[int, float]] = deque()  # due, waiting for a free connection
    in_flight: dict[Connection, tuple[int, float]] = {}
    free: list[Connection] = []
    waited = 0
    done = loop.create_future()
    answered = 0

    def dispatch() -> None:
        while pending and free:
            conn = free.pop()
            index, due = pending.popleft()
            in_flight[conn] = (index, due)
            conn.send(build(index))

    def on_answer(conn: Connection, status: int, body: bytes) -> None:
        nonlocal answered
        _index, due = in_flight.pop(conn)
        latencies.append(time.perf_counter() - due)
        statuses[str(status)] += 1
        if b'"grabbed"' in body:
            bodies["grabbed"] += 1
        elif b'"already_grabbed"' in body:
            bodies["already"] += 1
        answered += 1
        free.append(conn)
        dispatch()
        if answered == total and not done.done():
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
            pending.append((index, due))
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
    latencies.sort()
    late.sort()
    issued_per_s = total / issue_seconds if issue_seconds > 0 else 0.0
    late_p99 = percentile(late, 0.99) or 0.0
    kept_up = issued_per_s >= KEPT_UP_RATE * rate
    sample = latencies if len(latencies) <= SAMPLE else random.sample(latencies, SAMPLE)
    return {
        "requests": total,
        "answered": answered,
        "unanswered": total - answered,
        "connections_lost": lost,
        "offered_per_s": round(rate, 1),
        "issued_per_s": round(issued_per_s, 1),
        "seconds": round(elapsed, 3),
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": round(latencies[-1] * 1000, 3) if latencies else None,
        "issue_late_p50_ms": percentile(late, 0.50),
        "issue_late_p99_ms": late_p99,
        "waited_for_connection": waited,
        "generator_cpu_share": round(cpu / elapsed, 3) if elapsed > 0 else None,
        "generator_kept_up": kept_up,
        "generator_on_time": late_p99 <= ON_TIME_LATE_MS,
        "statuses": dict(statuses),
        "grabbed": bodies["grabbed"],
        "already": bodies["already"],
        "latencies_ms": sorted(round(s * 1000, 3) for s in sample),
    }


def main(argv: list[str]) -> None:
    """Parse the command line, run, print the JSON result."""
    url, rate, seconds, connections, tag, mode, key, *params = argv
    build = request_builder(mode, key, tag, params)
    result = asyncio.run(run(url, float(rate), float(seconds), int(connections), build))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
