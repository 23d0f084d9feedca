"""What the packet scripts share: their key groups and arguments, and their calling context.

PACKET_KEYS and PACKET_ARGV start every script on one packet (named in lua/_packet_lib.lua);
RECORDED is what packet_create and packet_restore write of a packet. Each script's own
spec is in its operation's module (packet_grab: groupbuy.redpacket.grab; packet_create,
packet_admit, packet_unadmit: .admission; packet_read: .read; packet_restore: .recovery;
packet_expire: .sweeps), the only place that knows its KEYS, ARGV and replies;
groupbuy.redpacket.engine lists them all (docs/scripts.md is rendered from them, and
tests/lua/test_contracts.py checks the scripts' headers against them).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from groupbuy_client.wire import to_ms

from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.models import PacketRow
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import (
    Reply,
    ScriptCaller,
    ScriptSpec,
    shape,
    slots,
)

# The KEYS and ARGV every packet script starts with (named in lua/_packet_lib.lua).
PACKET_KEYS = slots(
    ("packet_hash", "the packet's state hash"),
    ("packet_shares", "list of the amounts still to grab, in grab order"),
    ("packet_grabs", "hash user -> 'seq|amount_cents|grabbed_at_ms|request token'"),
    ("packet_outbox", "the packet's outbox stream"),
    ("packet_pending", "pending index: zset packet_id -> ms of its oldest outbox record"),
    ("packet_due", "due index: zset packet_id -> expires_ms (active packets only)"),
    ("packet_blocklist", "blocked users hash (the copy of the packet's slot in a cluster)"),
    ("packet_order", "list of the grabbing users, the i-th of seq i ('' for a seq not taken)"),
    ("packet_recipients", "set of the users who may grab (a packet with recipients only)"),
    ("packet_attempts", "hash user -> wrong passwords given (a packet with a password only)"),
    ("packet_terms", "hash of what reads show of the send: message, shares_sha256, ..."),
)
PACKET_ARGV = slots(
    ("packet_id", "the packet"),
    ("shift_ms", "clock shift in ms (0 in production)"),
)
# What packet_create and packet_restore write of the packet, as SQL records it.
RECORDED = slots(
    ("sender_id", "the sender"),
    ("amount_cents", "the packet's amount"),
    ("count", "number of shares"),
    ("strategy", "how the amount was split"),
    ("created_ms", "when it was sent"),
    ("expires_ms", "when it expires"),
    ("retention_ms", "how long the keys outlive the expiry"),
    ("message", "the greeting ('' for none)"),
    ("shares_sha256", "the commitment to the shares ('' for a packet sent before commitments)"),
    ("recipients_count", "how many recipients (0: anyone may grab)"),
    ("gate", "the grab's checks, a letter each: r recipients, p password, s not the sender"),
    ("pw_salt", "the password's salt, hex ('' for none)"),
    ("pw_hash", "hex SHA-256 of the salt's bytes then the password's UTF-8 ('' for none)"),
)

OK, EXISTING, PACKET_NOT_FOUND = PacketCode.OK, PacketCode.EXISTING, PacketCode.PACKET_NOT_FOUND
NO_PACKET = shape("no such packet")
# A request's token: 9 random bytes, 12 URL-safe characters stored with each grab or send.
REQUEST_TOKEN_BYTES = 9


def gate(row: PacketRow) -> str:
    """The letters of the checks a grab of this packet runs ('' for none: the hot path)."""
    return (
        ("r" if row.recipients_count else "")
        + ("p" if row.password_hash else "")
        + ("" if row.sender_may_grab else "s")
    )


def recorded_args(row: PacketRow, retention_s: int) -> dict[str, Any]:
    """RECORDED by name: what packet_create and packet_restore write of the packet, as SQL
    records it."""
    return {
        "sender_id": row.sender_id,
        "amount_cents": row.amount_cents,
        "count": row.count,
        "strategy": row.strategy,
        "created_ms": to_ms(row.created_at),
        "expires_ms": to_ms(row.expires_at),
        "retention_ms": retention_s * 1000,
        "message": row.message or "",
        "shares_sha256": row.shares_sha256 or "",
        "recipients_count": row.recipients_count,
        "gate": gate(row),
        "pw_salt": row.password_salt or "",
        "pw_hash": row.password_hash or "",
    }


PacketReply = Reply[PacketCode]


class PacketScripts:
    """The calling context of the packet scripts: the script caller, the key layout, the
    clock. An operation calls its script with named keys and arguments and gets the reply
    read by the script's spec: its code and its fields by name."""

    def __init__(self, scripts: ScriptCaller, keys: Keys, clock: RedisClock) -> None:
        self.caller = scripts
        self.keys = keys
        self.clock = clock
        # A flash grab hits the same packets again and again: their KEYS, in PACKET_KEYS
        # order, are worked out once per packet rather than on every grab.
        self.packet_key_list = lru_cache(maxsize=4096)(self._packet_key_list)

    def _packet_key_list(self, packet_id: str) -> list[str]:
        """The KEYS every packet script takes (PACKET_KEYS) for one packet; no caller changes
        the list it gets."""
        named = self.keys.packet_keys(packet_id).named()
        return [named[slot.name] for slot in PACKET_KEYS]

    async def run(
        self,
        spec: ScriptSpec[PacketCode],
        packet_id: str,
        more: Sequence[Any] = (),
        **args: Any,
    ) -> PacketReply:
        """Run a script on one packet: PACKET_KEYS and PACKET_ARGV, then `args` by name and
        the variable tail `more`; its reply read by `spec`."""
        keys = spec.key_list(self.keys.packet_keys(packet_id))
        named = {"packet_id": packet_id, "shift_ms": self.clock.shift_ms, **args}
        return await spec.run(self.caller, keys, named, more)
