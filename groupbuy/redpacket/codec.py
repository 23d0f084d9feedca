"""Every string the packet scripts, this engine, the ledger and SQL must agree on.

- a grab in a packet's grabs hash: ``seq|amount_cents|grabbed_at_ms``;
- ledger business keys: ``deposit:<reference>``, ``packet_debit:<packet_id>``,
  ``grab:<packet_id>:<user_id>``, ``refund:<packet_id>`` — built in Python when entries
  are posted and in SQL (the ``*_sql`` functions) when reconciliation joins entries to
  the rows they belong to;
- the dedup keys of packet events: ``<type>:<packet_id>``.

Ids match ``[A-Za-z0-9_-]{1,64}``, so neither '|' nor ':' can occur inside one.
tests/lua/test_codecs.py checks this module against what the scripts and the
write-behind really store.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import SQLColumnExpression, String, literal

DEPOSIT, PACKET_DEBIT, GRAB, REFUND = "deposit", "packet_debit", "grab", "refund"
# The kind column of the ledger entry each business key belongs to.
ENTRY_KINDS = {
    DEPOSIT: "deposit",
    PACKET_DEBIT: "packet_debit",
    GRAB: "grab_credit",
    REFUND: "refund_credit",
}


class Grab(NamedTuple):
    """One grab as a packet's grabs hash holds it."""

    seq: int
    amount_cents: int
    grabbed_at_ms: int


class BusinessKey(NamedTuple):
    """What a ledger business key names: its kind and the packet, user or reference."""

    kind: str
    packet_id: str | None = None
    user_id: str | None = None
    reference: str | None = None


def grab_value(seq: int, amount_cents: int, grabbed_at_ms: int) -> str:
    """`seq|amount_cents|grabbed_at_ms`, as packet_grab writes it."""
    return f"{seq}|{amount_cents}|{grabbed_at_ms}"


def parse_grab(value: str) -> Grab:
    """A grabs-hash value; ValueError when it is not `seq|amount_cents|grabbed_at_ms`."""
    seq, amount_cents, grabbed_at_ms = value.split("|")
    return Grab(int(seq), int(amount_cents), int(grabbed_at_ms))


def deposit_key(reference: str) -> str:
    """The business key of a deposit (one per reference)."""
    return f"{DEPOSIT}:{reference}"


def packet_debit_key(packet_id: str) -> str:
    """The business key of the debit that funds a packet."""
    return f"{PACKET_DEBIT}:{packet_id}"


def grab_credit_key(packet_id: str, user_id: str) -> str:
    """The business key of a grab's credit to the grabber."""
    return f"{GRAB}:{packet_id}:{user_id}"


def refund_key(packet_id: str) -> str:
    """The business key of a packet's refund to its sender."""
    return f"{REFUND}:{packet_id}"


def parse_business_key(key: str) -> BusinessKey | None:
    """What a ledger business key names, or None for a key of no known kind."""
    kind, _, rest = key.partition(":")
    if not rest:
        return None
    if kind == DEPOSIT:
        return BusinessKey(kind, reference=rest)
    if kind in (PACKET_DEBIT, REFUND):
        return BusinessKey(kind, packet_id=rest)
    if kind == GRAB:
        packet_id, _, user_id = rest.partition(":")
        return BusinessKey(kind, packet_id=packet_id, user_id=user_id) if user_id else None
    return None


def _concat(*parts: str | SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """SQL `a || b || ...` over literals and columns."""
    terms = [literal(p, String) if isinstance(p, str) else p for p in parts]
    expression = terms[0]
    for term in terms[1:]:
        expression = expression + term
    return expression


def packet_debit_key_sql(packet_id: SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """packet_debit_key() computed by SQL from a packet id column."""
    return _concat(f"{PACKET_DEBIT}:", packet_id)


def grab_credit_key_sql(
    packet_id: SQLColumnExpression[str], user_id: SQLColumnExpression[str]
) -> SQLColumnExpression[str]:
    """grab_credit_key() computed by SQL from packet and user id columns."""
    return _concat(f"{GRAB}:", packet_id, ":", user_id)


def refund_key_sql(packet_id: SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """refund_key() computed by SQL from a packet id column."""
    return _concat(f"{REFUND}:", packet_id)


def packet_event_key(kind: str, packet_id: str) -> str:
    """The dedup key of a packet event (each happens once per packet)."""
    return f"{kind}:{packet_id}"


def parse_packet_event_key(key: str) -> tuple[str, str] | None:
    """(type, packet_id) of a packet event's dedup key, or None for another engine's key."""
    kind, _, packet_id = key.partition(":")
    if not kind.startswith("packet.") or not packet_id:
        return None
    return kind, packet_id.split(":", 1)[0]
