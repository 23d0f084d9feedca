"""What signed requests cost: the HMAC itself (timeit), the server's whole check of one
request (HMAC, compare, SET NX PX in Redis), then a request's time through the app
in-process with and without signing (the client's signing included).

Usage: python -m benchmarks.signing [--requests N] [--redis-url URL]
Without --redis-url a private redis-server (or valkey-server) is started on a free port.
The in-process figures include the client's own work; the machine's other load moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import httpx
from starlette.requests import Request

from groupbuy.api.app import create_app
from groupbuy.api.auth import Authenticator, FingerprintKey
from groupbuy.client import GroupBuyClient
from groupbuy.settings import ApiKey, load_settings
from groupbuy.signing import signature
from groupbuy.storage.keys import Keys
from groupbuy.storage.redis_client import connect_redis
from groupbuy.storage.signatures import SeenSignatures
from groupbuy.testing.servers import start_redis

KEY = "bench-service-key-0123456789"


def hmac_cost_us(body: bytes, number: int) -> float:
    """Microseconds per signature of a request with this body (what each side computes)."""
    target = b"/v1/redpackets/pk-1/grab"
    seconds = timeit.timeit(
        lambda: signature(KEY, "POST", target, "1700000000", body), number=number
    )
    return seconds / number * 1e6


async def check_cost_us(redis_url: str, requests: int) -> float:
    """Microseconds per server-side check of a signed request (HMAC, constant-time compare,
    SET NX PX), each request a distinct one signed beforehand."""
    settings = load_settings(None, {"GROUPBUY_REDIS_URL": redis_url})
    redis = connect_redis(settings.redis)
    auth = Authenticator(
        (ApiKey("service", KEY),),
        SeenSignatures(redis, Keys(f"bench-{secrets.token_hex(4)}"), 600_000),
        fingerprints=FingerprintKey(secrets.token_hex(32)),
    )
    key = ApiKey("service", KEY)
    path, stamp = b"/v1/redpackets/pk-1/grab", str(int(time.time()))
    prepared = []
    for n in range(requests):
        body = json.dumps({"user_id": f"u{n}"}).encode()
        signed = signature(KEY, "POST", path, stamp, body)
        headers = [
            (b"x-groupbuy-timestamp", stamp.encode()),
            (b"x-groupbuy-signature", signed.encode()),
        ]
        scope = {
            "type": "http",
            "method": "POST",
            "path": path.decode(),
            "raw_path": path,
            "query_string": b"",
            "headers": headers,
        }
        prepared.append((Request(scope), body))
    try:
        await redis.ping()
        started = time.perf_counter()
        for request, body in prepared:
            await auth.check_signature(request, key, body)
        return (time.perf_counter() - started) / requests * 1e6
    finally:
        await redis.aclose()


async def per_request_us(redis_url: str, signed: bool, requests: int, rounds: int) -> list[float]:
    """Microseconds per GET /v1/accounts/{id} through the app, each round's mean."""
    with tempfile.TemporaryDirectory() as directory:
        settings = load_settings(
            None,
            {
                "GROUPBUY_API_KEYS": f"service:{KEY}",
                "GROUPBUY_REDIS_URL": redis_url,
                "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{Path(directory) / 'b.db'}",
                "GROUPBUY_AUTH_SIGNED_REQUESTS": "true" if signed else "false",
                "GROUPBUY_SCHEDULER_ENABLED": "false",
            },
        )
        app = create_app(settings)
        means = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with GroupBuyClient("http://bench", KEY, sign=signed, transport=transport) as gb:
                for _ in range(rounds):
                    started = time.perf_counter()
                    for n in range(requests):
                        await gb.account(f"u{n}")  # distinct targets: no stamp moved ahead
                    means.append((time.perf_counter() - started) / requests * 1e6)
        return means


async def measure(redis_url: str, requests: int, rounds: int) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, url in (("fakeredis", ""), ("redis-server", redis_url)):
        found[f"{name}_check_us"] = statistics.median(
            [await check_cost_us(url, requests) for _ in range(rounds)]
        )
        plain: list[float] = []
        signed: list[float] = []
        for _ in range(rounds):  # alternated, so a change in the machine's load hits both
            plain += await per_request_us(url, False, requests, 1)
            signed += await per_request_us(url, True, requests, 1)
        found[f"{name}_unsigned_us"] = statistics.median(plain)
        found[f"{name}_signed_us"] = statistics.median(signed)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url", default=os.environ.get("GROUPBUY_TEST_REDIS_URL", ""))
    args = parser.parse_args()
    figures = {
        "hmac_small_body_us": hmac_cost_us(b'{"user_id":"bob"}', 100_000),
        "hmac_64kib_body_us": hmac_cost_us(b"x" * 65536, 2_000),
    }
    server = None if args.redis_url else start_redis()
    try:
        url = args.redis_url or (server.url if server else "")
        figures.update(asyncio.run(measure(url, args.requests, args.rounds)))
    finally:
        if server is not None:
            server.stop()
    for backend in ("fakeredis", "redis-server"):
        extra = figures[f"{backend}_signed_us"] - figures[f"{backend}_unsigned_us"]
        figures[f"{backend}_signing_adds_us"] = extra
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}, indent=2))


if __name__ == "__main__":
    main()
