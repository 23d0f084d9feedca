"""Which URLs an endpoint may have, and the address check at connect time."""

from __future__ import annotations

import pytest

from groupbuy.webhooks.addresses import (
    forbidden,
    host_problem,
    url_problem,
)
from groupbuy.webhooks.sender import Sender
from tests.support.receiver import Receiver


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "224.0.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "fc00::1",
        "100.64.0.1",
    ],
)
def test_private_and_special_addresses_are_forbidden(address: str) -> None:
    assert forbidden(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700:4700::1111", "8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert not forbidden(address)


@pytest.mark.parametrize(
    ("url", "allow_http", "problem"),
    [
        ("https://shop.example/hooks", False, None),
        ("http://shop.example/hooks", False, "must start with https://"),
        ("http://shop.example/hooks", True, None),
        ("ftp://shop.example/", True, "must start with"),
        ("https:///nohost", False, "must name a host"),
        ("https://user:pw@shop.example/", False, "must not carry credentials"),
        ("https://shop.example:99999/", False, "is not a URL"),
        ("https://shop.example/a b", False, "spaces"),
        ("https://shop.example/#x", False, "fragment"),
        ("https://" + "a" * 3000 + ".example/", False, "at most"),
    ],
)
def test_url_rules(url: str, allow_http: bool, problem: str | None) -> None:
    found = url_problem(url, allow_http)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


async def test_a_host_on_loopback_is_refused_at_registration() -> None:
    problem = await host_problem("https://localhost/hooks")
    assert problem is not None and "127.0.0.1" in problem
    assert await host_problem("https://127.0.0.1:8443/") is not None
    assert await host_problem("https://no-such-host.invalid/") is not None


async def test_a_delivery_to_a_private_address_is_refused_at_connect_time(
    receiver: Receiver,
) -> None:
    """The name passed the registration check once; at delivery the address connected to is
    what counts (here a loopback one: DNS rebinding lands the same way)."""
    sender = Sender(timeout_s=2.0, max_connections=2, allow_private_networks=False)
    try:
        reply = await sender.post("e1", receiver.url, b"{}", {})
    finally:
        await sender.aclose()
    assert reply.error == "address_refused" and reply.status_code is None
    assert receiver.received == []
    allowed = Sender(timeout_s=2.0, max_connections=2, allow_private_networks=True)
    try:
        reply = await allowed.post("e1", receiver.url, b"{}", {})
    finally:
        await allowed.aclose()
    assert reply.status_code == 200 and len(receiver.received) == 1
