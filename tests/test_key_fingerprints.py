"""The fingerprint that names an API key in the audit log (SPEC §3 Console) is an HMAC of the
secret under a server-side secret: a reader of the log cannot test guesses offline; every
process of one service names a key alike; another server-side secret gives other names."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from starlette.testclient import TestClient

from groupbuy.api.access import fingerprint
from groupbuy.api.app import create_app
from groupbuy.settings import Settings, SettingsError, load_settings
from tests.support.backends import REAL
from tests.support.console import sign_in
from tests.support.http import ADMIN, ADMIN_KEY, app_services, assert_ok, portal

SECRET = "server-side-fingerprint-secret-1"


def _actor_of_a_block(settings: Settings, uid: str = "u1") -> str:
    """The audit log's actor of one admin action through the API, on a fresh app."""
    with TestClient(create_app(settings)) as client:
        assert_ok(client.put(f"/v1/admin/blocked-users/{uid}", json={}, headers=ADMIN), 200)
        page = assert_ok(client.get("/v1/admin/audit", headers=ADMIN), 200)
    actor: str = page["entries"][0]["actor"]
    return actor


def test_the_fingerprint_is_no_bare_hash_of_the_secret(settings: Settings) -> None:
    actor = _actor_of_a_block(settings)
    role, _, named = actor.partition(":")
    assert role == "admin" and len(named) == 16 and int(named, 16) >= 0
    assert named != hashlib.sha256(ADMIN_KEY.encode()).hexdigest()[:16]
    assert ADMIN_KEY not in actor


def test_a_configured_secret_keys_the_hmac(settings: Settings) -> None:
    actor = _actor_of_a_block(settings.replace("auth", fingerprint_secret=SECRET))
    expected = hmac.new(SECRET.encode(), ADMIN_KEY.encode(), hashlib.sha256).hexdigest()[:16]
    assert actor == f"admin:{expected}" == f"admin:{fingerprint(ADMIN_KEY, SECRET.encode())}"


def test_two_apps_with_one_configured_secret_name_a_key_alike(settings: Settings) -> None:
    chosen = settings.replace("auth", fingerprint_secret=SECRET)
    assert _actor_of_a_block(chosen, "u1") == _actor_of_a_block(chosen, "u2")


def test_another_server_side_secret_gives_another_fingerprint(settings: Settings) -> None:
    one = _actor_of_a_block(settings.replace("auth", fingerprint_secret=SECRET))
    other = _actor_of_a_block(settings.replace("auth", fingerprint_secret=SECRET[::-1]))
    assert one != other


@pytest.mark.parametrize("backend", [REAL])  # one Redis server that both apps reach
def test_without_a_configured_secret_every_app_on_one_redis_shares_the_generated_one(
    settings: Settings,
) -> None:
    # Two apps stand for two processes, replicas, or one before and after a restart.
    first = _actor_of_a_block(settings, "u1")
    assert _actor_of_a_block(settings, "u2") == first
    with TestClient(create_app(settings)) as client:
        services = app_services(client)
        kept = portal(client).call(services.redis.get, services.keys.fingerprint_secret())
        assert kept and len(kept) == 64
        assert first == f"admin:{fingerprint(ADMIN_KEY, kept.encode())}"
        # the console names the operator the same way
        sign_in(client, ADMIN_KEY)
        assert f"admin · {first.partition(':')[2]}" in client.get("/console").text


def test_a_short_configured_secret_is_refused() -> None:
    with pytest.raises(SettingsError, match="fingerprint_secret"):
        load_settings(None, {"GROUPBUY_AUTH_FINGERPRINT_SECRET": "short"})
    chosen = load_settings(None, {"GROUPBUY_AUTH_FINGERPRINT_SECRET": SECRET})
    assert chosen.auth.fingerprint_secret == SECRET
    assert SECRET not in repr(chosen)
