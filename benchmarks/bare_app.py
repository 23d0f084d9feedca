"""Baseline for the HTTP benchmark: bare Starlette, one POST endpoint, ONE Redis call.

POST /grab {"user_id": ...} runs one EVALSHA of a trivial script (HINCRBY of the user in one
hash) and answers small JSON; GET /healthz answers without Redis. Served by uvicorn with the
options `groupbuy serve` uses (log_level warning; a factory import string when workers > 1).
Usage: BARE_REDIS_URL=redis://... python -m benchmarks.bare_app --port P --workers N
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from groupbuy.cli import run_workers

SCRIPT = "return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)"
KEY = "bare:grabs"


def create_app() -> Starlette:
    """The app; the Redis URL comes from BARE_REDIS_URL (the client is made per process)."""
    client = aioredis.Redis.from_url(
        os.environ.get("BARE_REDIS_URL", "redis://127.0.0.1:6379/0"),
        decode_responses=True,
        max_connections=256,
    )
    state: dict[str, str] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state["sha"] = await client.script_load(SCRIPT)
        try:
            yield
        finally:
            await client.aclose()

    async def grab(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        count = await client.evalsha(state["sha"], 1, KEY, str(body["user_id"]))
        return JSONResponse({"status": "grabbed", "count": int(count)})

    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[Route("/grab", grab, methods=["POST"]), Route("/healthz", healthz)],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if args.workers > 1:
        # exactly how `groupbuy serve --workers N` serves, TCP_NODELAY included
        run_workers("benchmarks.bare_app:create_app", args.host, args.port, args.workers)
    else:
        uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
