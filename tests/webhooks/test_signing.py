"""Signatures per Standard Webhooks, checked with the reference library (standardwebhooks)."""

from __future__ import annotations

import base64
import time

import pytest
import standardwebhooks

from groupbuy.webhooks.signing import SECRET_PREFIX, headers, new_secret, secret_key
from tests.support.receiver import Received
from tests.support.webhooks import verified


def _received(secrets_in_use: list[str], body: bytes = b'{"type":"team.formed"}') -> Received:
    signed = headers(secrets_in_use, "evt_7", int(time.time()), body)
    return Received(signed, body, "200", 0.0)


def test_a_secret_is_whsec_and_24_random_bytes() -> None:
    first, second = new_secret(), new_secret()
    assert first.startswith(SECRET_PREFIX) and first != second
    assert len(secret_key(first)) == 24
    assert base64.b64encode(secret_key(first)).decode() == first.removeprefix(SECRET_PREFIX)


def test_the_reference_library_accepts_our_signature() -> None:
    secret = new_secret()
    assert verified(secret, _received([secret])) == {"type": "team.formed"}


def test_the_reference_library_refuses_another_secret_or_a_changed_body() -> None:
    secret = new_secret()
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verified(new_secret(), _received([secret]))
    tampered = _received([secret])
    changed = Received(tampered.headers, b'{"type":"team.failed"}', "200", 0.0)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verified(secret, changed)


def test_during_an_overlap_both_secrets_sign_and_each_verifies_alone() -> None:
    new, old = new_secret(), new_secret()
    received = _received([new, old])
    assert len(received.headers["webhook-signature"].split(" ")) == 2
    assert verified(new, received) and verified(old, received)
    assert all(part.startswith("v1,") for part in received.headers["webhook-signature"].split())


def test_the_headers_are_the_three_of_the_specification() -> None:
    received = _received([new_secret()])
    assert set(received.headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert received.headers["webhook-id"] == "evt_7"
    assert received.headers["webhook-timestamp"].isdigit()
