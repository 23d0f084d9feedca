"""The packet scripts' outbox records: each type's fields and its event's dedup key
(groupbuy/redpacket/recording.py applies them to SQL).

To add an event type: the script that changes state emits it (`emit({...})` in lua/), and
this module gains its record TypedDict (in PACKET_RECORDS) and its name in EVENT_TYPES,
and recording.py its branch in `apply_packet_records`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple, Required, TypedDict

from groupbuy.redpacket.codec import KEY
from groupbuy.storage.typedrecords import parse_record

# <type>:<packet_id>
EVENT_TYPES = ("packet.sent", "packet.sold_out", "packet.withdrawn", "packet.refunded")


# -- event dedup keys -----------------------------------------------------------------


class PacketEventKey(NamedTuple):
    """The identity of a packet event: ``<type>:<packet_id>``."""

    type: str
    packet_id: str


def packet_event_key(event_type: str, packet_id: str) -> str:
    """The dedup key an event of the packet engine is recorded under (one per packet)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"{event_type!r} is not an event of the packet engine")
    return KEY.join((event_type, packet_id))


def parse_event_key(key: str) -> PacketEventKey | None:
    """A packet event's dedup key, or None for an event of another engine."""
    event_type, *parts = key.split(KEY)
    if event_type not in EVENT_TYPES:
        return None
    if len(parts) != 1 or not parts[0]:
        raise ValueError(f"event key {key!r} is not '<type>:<packet_id>'")
    return PacketEventKey(event_type, parts[0])


# -- outbox records: the fields each `emit({...})` of the packet scripts writes -----------


class _Fenced(TypedDict, total=False):
    epoch: str  # the epoch of the Redis state that wrote it (records from before epochs: 0)


class GrabRecord(_Fenced):
    """lua/packet_grab.lua: one grabbed share."""

    type: Literal["grab"]
    at_ms: str
    packet_id: str
    user_id: str
    amount_cents: str
    seq: str


class _Ending(_Fenced, total=False):
    version: str  # the packet's version after the change (records from before versions: none)


class PacketSoldOut(_Ending):
    """lua/packet_grab.lua (the last share) or lua/packet_restore.lua: nothing left."""

    type: Literal["packet.sold_out"]
    at_ms: str
    packet_id: str
    sender_id: str


class PacketWithdrawn(_Ending):
    """lua/_packet_lib.lua (a withdrawal), just before its packet.refunded: the sender
    took the packet back."""

    type: Literal["packet.withdrawn"]
    at_ms: str
    packet_id: str
    sender_id: str


class PacketRefunded(_Ending, total=False):
    """lua/_packet_lib.lua (an expiry or a withdrawal), or a packet that expired before it
    was sent: the rest goes back to the sender. The last record of its packet."""

    type: Required[Literal["packet.refunded"]]
    at_ms: Required[str]
    packet_id: Required[str]
    sender_id: Required[str]
    refunded_cents: Required[str]
    remaining_count: Required[str]
    reason: str  # expired | withdrawn (records from before withdrawals: none, expired)


PacketEnding = PacketSoldOut | PacketWithdrawn | PacketRefunded
PacketRecord = GrabRecord | PacketEnding
PACKET_RECORDS: dict[str, type[PacketRecord]] = {
    "grab": GrabRecord,
    "packet.sold_out": PacketSoldOut,
    "packet.withdrawn": PacketWithdrawn,
    "packet.refunded": PacketRefunded,
}
"""Every packet record type by its `type` field."""


def parse_packet_record(fields: Mapping[str, str]) -> PacketRecord:
    """An outbox entry's fields as the packet record its `type` names: ValueError for an
    unknown type, KeyError for a missing field."""
    return parse_record("packet", PACKET_RECORDS, fields)
