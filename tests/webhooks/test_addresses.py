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

HOSTILE_IPV4 = [
    "0.0.0.0",
    "0.1.2.3",
    "10.1.2.3",
    "100.64.0.1",
    "100.127.255.254",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.169.254",
    "172.16.0.1",
    "172.31.255.254",
    "192.0.0.8",
    "192.0.0.170",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.1.1",
    "198.18.0.1",
    "198.19.255.254",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
]
HOSTILE_IPV6 = [
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible (deprecated): outside global unicast
    "::ffff:0:7f00:1",  # IPv4-translated: outside global unicast
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::1",  # NAT64 local use
    "100::1",
    "2001::1",  # Teredo with server 0.0.0.0
    "2001:0:7f00:1::f7f7:f7f7",  # Teredo server 127.0.0.1, client 8.8.8.8
    "2001:0:808:808::80ff:fffe",  # Teredo server 8.8.8.8, client 127.0.0.1
    "2001:0:808:808::5601:5601",  # Teredo server 8.8.8.8, client 169.254.169.254
    "2001:2::1",  # benchmarking
    "2001:10::1",  # ORCHID
    "2001:db8::1",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    "2002::1",  # 6to4 of 0.0.0.0
    "3fff::1",
    "5f00::1",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",
    "ff02::1",
    "ff0e::1",
]


@pytest.mark.parametrize("address", HOSTILE_IPV4 + HOSTILE_IPV6)
def test_private_and_special_addresses_are_forbidden(address: str) -> None:
    assert forbidden(address)


@pytest.mark.parametrize(
    "address",
    [
        "93.184.215.14",
        "8.8.8.8",
        "1.1.1.1",
        "192.0.3.1",
        "100.128.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8",  # IPv4-mapped, judged as 8.8.8.8
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
        "2001:0:808:808::fefe:fefe",  # Teredo server 8.8.8.8, client 1.1.1.1
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert not forbidden(address)


@pytest.mark.parametrize(
    ("url", "allow_http", "problem"),
    [
        ("https://shop.example/hooks", False, None),
        ("http://shop.example/hooks", False, "[webhooks] allow_http"),  # names the setting
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
    assert "[webhooks] allow_private_networks" in problem  # names the setting
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
