"""Which hosts a delivery may reach: the URL rules, and the address check at connect time.

A name is checked when the endpoint is registered and, again, on the address each
connection is actually opened to (`http1.Pool` checks it before connecting): a name that
resolves to a public address at registration and to a private one later (DNS rebinding)
is refused at the connection, where it matters.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048


class AddressRefused(ConnectionRefusedError):
    """A connection to a loopback, private, link-local, multicast or reserved address was
    refused before it was opened."""


# The IANA special-purpose address registries, written out so that the answer does not
# move with the interpreter's `ipaddress` (whose `is_global` changed between releases).
DENIED_V4 = tuple(
    ipaddress.IPv4Network(network)
    for network in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local (cloud metadata services)
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved
        "255.255.255.255/32",  # limited broadcast
    )
)
# Only global unicast (2000::/3) may be reached; inside it, these may not. Addresses that
# carry an IPv4 address (IPv4-mapped, NAT64 64:ff9b::/96, 6to4 2002::/16, Teredo
# 2001::/32) are judged by the IPv4 addresses they carry, before this list.
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
DENIED_V6 = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "::/128",  # unspecified
        "::1/128",  # loopback
        "::ffff:0:0/96",  # IPv4-mapped (unwrapped first)
        "64:ff9b:1::/48",  # NAT64 local use
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo 2001::/32 is unwrapped first)
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4 (unwrapped first)
        "3fff::/20",  # documentation
        "5f00::/16",  # segment routing (SRv6) SIDs
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 addresses an IPv6 address leads to (IPv4-mapped, NAT64 well-known prefix,
    6to4, Teredo server and client), or None when it carries none."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in NAT64_WELL_KNOWN:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)  # the Teredo server and the client
    return None


def forbidden(address: str) -> bool:
    """Whether an IP address is one deliveries may not reach without
    `allow_private_networks`: any address in the IANA special-purpose registries, any IPv6
    address outside global unicast, and any IPv6 address that carries an IPv4 address
    (IPv4-mapped, NAT64, 6to4, Teredo) whose IPv4 address is one of those."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return any(ip in network for network in DENIED_V4)
    carried = embedded_ipv4(ip)
    if carried is not None:
        return any(inner in network for inner in carried for network in DENIED_V4)
    if ip not in GLOBAL_UNICAST_V6:
        return True
    return any(ip in network for network in DENIED_V6)


def url_problem(url: str, allow_http: bool) -> str | None:
    """Why `url` cannot be an endpoint's URL (its form only), or None."""
    if len(url) > MAX_URL_LENGTH:
        return f"must be at most {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"is not a URL: {error}"
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes:
        allowed = (
            "https:// or http://"
            if allow_http
            else "https:// (http:// only with [webhooks] allow_http, for development)"
        )
        return f"must start with {allowed}"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (they would show wherever the URL does)"
    if parts.fragment:
        return "must not have a #fragment"
    if port == 0:
        return "must not name port 0"
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        return "must not contain spaces or control characters"
    return None


async def host_problem(url: str) -> str | None:
    """Why the host of `url` may not be reached (it resolves to an address `forbidden`
    refuses, or not at all), or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return f"the host {host!r} does not resolve"
    refused = sorted({str(info[4][0]) for info in found if forbidden(str(info[4][0]))})
    if refused:
        return (
            f"the host {host!r} resolves to {', '.join(refused)}: loopback, private, "
            "link-local and multicast addresses are refused ([webhooks] allow_private_networks)"
        )
    return None
