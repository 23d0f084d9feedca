"""The background-jobs scenario alone (benchmarks/engine/background.py), on a private
redis-server and a temporary SQLite file, at any size. Usage:

    .venv/bin/python -m benchmarks.background [--packets 100000] [--activities 10000]
        [--rounds 20] [--shares 1000] [--users 1500]
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks.engine.background import background
from benchmarks.engine.common import open_services, private_redis_and_sqlite
from benchmarks.measure import Row


def main() -> None:
    """Parse the sizes, start a private redis-server, run the scenario, stop everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--activities", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shares", type=int, default=1000)
    parser.add_argument("--users", type=int, default=1500)
    args = parser.parse_args()

    async def go(redis_url: str, database_url: str) -> list[Row]:
        services = await open_services(redis_url, database_url)
        try:
            return await background(
                services, "cli", args.packets, args.activities, args.rounds,
                args.shares, args.users,
            )  # fmt: skip
        finally:
            await services.scripts.aclose()
            await services.redis.aclose()
            await services.database.dispose()

    with private_redis_and_sqlite() as urls:
        asyncio.run(go(*urls))


if __name__ == "__main__":
    main()
