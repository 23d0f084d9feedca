"""Which groupbuy modules one in-process seat lock runs through, from the route to the answer.

A new engineer follows a lock through these modules; docs/architecture.md quotes the count.
The app runs on fakeredis and a throwaway SQLite file; only the lock request is traced
(activity and team are made first).

    .venv/bin/python scripts/path_modules.py            # the count and the modules, in order
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from groupbuy.api.app import create_app  # noqa: E402
from tests.support.http import ADMIN, SERVICE  # noqa: E402
from tests.support.schema import database_with_schema  # noqa: E402
from tests.support.settings import settings_for  # noqa: E402

LOCK = "/v1/activities/a1/teams/t1/locks"


async def traced_modules(client: httpx.AsyncClient) -> list[str]:
    """The groupbuy modules whose functions ran for one lock request, first call first."""
    seen: dict[str, None] = {}
    request = asyncio.current_task()  # the app runs inside the client's call, in this task

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        # Background work (jobs, writers) shares the loop: not the lock's path.
        if name.startswith("groupbuy.") and asyncio.current_task() is request:
            seen.setdefault(name, None)

    sys.setprofile(profile)
    try:
        answer = await client.post(LOCK, json={"user_id": "u2"}, headers=SERVICE)
    finally:
        sys.setprofile(None)
    answer.raise_for_status()
    return list(seen)


async def lock_path() -> list[str]:
    """Make an activity and a team, lock once to warm up, then trace a second lock."""
    with tempfile.TemporaryDirectory() as place:
        app = create_app(settings_for("", database_with_schema(Path(place))))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                created = {"activity_id": "a1", "team_size": 3, "lock_ttl_s": 300}
                (
                    await client.post("/v1/activities", json=created, headers=ADMIN)
                ).raise_for_status()
                team = {"leader_id": "u1", "team_id": "t1", "order_id": "o1"}
                opened = await client.post("/v1/activities/a1/teams", json=team, headers=SERVICE)
                opened.raise_for_status()
                # A first lock warms what runs once (script loading, caches).
                first = await client.post(LOCK, json={"user_id": "u3"}, headers=SERVICE)
                first.raise_for_status()
                return await traced_modules(client)


def main() -> None:
    modules = asyncio.run(lock_path())
    print(f"{len(modules)} groupbuy modules on a seat lock's path:")
    for name in modules:
        print(f"  {name}")


if __name__ == "__main__":
    main()
