"""Settings for tests: a test's own SQLite file, the backend's Redis, known keys."""

from __future__ import annotations

from pathlib import Path

from groupbuy.settings import Settings, load_settings
from groupbuy.testing.servers import free_port
from tests.support.http import API_KEYS


def settings_for(tmp_path: Path, redis_url: str, **environ: str) -> Settings:
    """Settings on `redis_url` ('' = a fresh embedded fakeredis) with a SQLite file in tmp_path."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'groupbuy.db'}",
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "0.05",
            **environ,
        },
    )


def settings_without_redis(tmp_path: Path) -> Settings:
    """Settings whose Redis URL points at a closed loopback port (Redis is down)."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
            "GROUPBUY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": "0.2",
        },
    )
