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


def forbidden(address: str) -> bool:
    """Whether an IP address is one deliveries may not reach without
    `allow_private_networks` (an IPv4 address inside IPv6 is judged as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or not ip.is_global
    )


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
        allowed = "https:// or http://" if allow_http else "https:// (http:// is not allowed)"
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
