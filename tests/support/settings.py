"""Settings the tests run with: known API keys, a database of their own (at the head
revision), a chosen Redis."""

from __future__ import annotations

from pathlib import Path

from groupbuy.settings import Settings, load_settings
from tests.support.http import ADMIN_KEY, SERVICE_KEY, VIEWER_KEY
from tests.support.redis import is_cluster_url
from tests.support.schema import database_with_schema
from tests.support.servers import free_port

API_KEYS = f"admin:{ADMIN_KEY},service:{SERVICE_KEY},viewer:{VIEWER_KEY}"
# Rate limits stay on (every HTTP test goes through the check and its headers, and the
# per-key defaults never bite), but tests poll one user at machine speed (a balance every
# 20 ms until a credit lands): per user, far above the defaults meant for people.
# tests/test_http_ratelimit.py sets its own limits.
TEST_RATE_LIMITS = {
    f"GROUPBUY_RATELIMIT_{route_class.upper()}_USER_QUOTA": "1000000"
    for route_class in ("seat", "grab", "send", "read")
}


# Key guessing: tests send many wrong keys from the one TestClient address (every route's
# 401s, a fuzzer's); tests/test_http_key_guessing.py sets its own limits.
TEST_GUESS_LIMIT = {"GROUPBUY_AUTH_GUESS_LIMIT": "1000000"}


def settings_for(redis_url: str, database_url: str) -> Settings:
    """Settings for one test: this Redis ('' for fakeredis; cluster mode when it names a
    cluster node), this database (the `database_url` fixture's, or
    tests.support.database.sqlite_url), known keys."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": database_url,
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_REDIS_CLUSTER": str(is_cluster_url(redis_url)).lower(),
            "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "0.05",
            **TEST_RATE_LIMITS,
            **TEST_GUESS_LIMIT,
        },
    )


def settings_without_redis(tmp_path: Path) -> Settings:
    """Settings whose Redis URL points at a closed loopback port (Redis is down), on a SQLite
    file: what these tests check is the answer when Redis is away, which no database changes."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": database_with_schema(tmp_path, name="db"),
            "GROUPBUY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": "0.2",
        },
    )
