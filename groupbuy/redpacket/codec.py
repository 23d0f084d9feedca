"""Every string the packet scripts, Python and SQL share, built and parsed in one place.

The grab value and the outbox records (`emit({...})`) are written by the packet scripts;
ledger business keys and event dedup keys are written by Python into SQL and rebuilt by
reconciliation inside SQL statements, so each key has a Python builder and an
SQL-expression builder made from the same parts.
Ids match ``^[A-Za-z0-9_-]{1,64}$`` (SPEC §2): neither '|' nor ':' occurs inside a field."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import SQLColumnExpression, String, literal

FIELD = "|"  # between the fields of a Redis value
KEY = ":"  # between the parts of a business key or an event key

# The first part of each ledger business key, and the parts that follow it.
GRAB_CREDIT = "grab"  # grab:<packet_id>:<user_id>
REFUND = "refund"  # refund:<packet_id>
PACKET_DEBIT = "packet_debit"  # packet_debit:<packet_id>
DEPOSIT = "deposit"  # deposit:<reference>
_KEY_PARTS = {
    GRAB_CREDIT: ("packet_id", "user_id"),
    REFUND: ("packet_id",),
    PACKET_DEBIT: ("packet_id",),
    DEPOSIT: ("reference",),
}


def _int(text: str, value: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{value!r} has a non-integer field {text!r}")
    return int(text)


class Grab(NamedTuple):
    """A grab's value in the packet's grabs hash: ``seq|amount_cents|grabbed_at_ms|token``.

    `token` is the request token of the grab call that took the share ('' for a grab
    rebuilt from SQL, and in values written before tokens existed, which have 3 fields):
    a resent call with the same token answers `grabbed` again instead of `already_grabbed`.
    """

    seq: int
    amount_cents: int
    at_ms: int
    token: str = ""


def grab_value(seq: int, amount_cents: int, at_ms: int, token: str = "") -> str:
    """The grabs-hash value packet_grab writes for one grab (packet_restore: no token)."""
    if FIELD in token:
        raise ValueError(f"grab token {token!r} contains {FIELD!r}")
    return FIELD.join((str(seq), str(amount_cents), str(at_ms), token))


def parse_grab(value: str) -> Grab:
    """A grabs-hash value as packet_grab or packet_restore wrote it."""
    parts = value.split(FIELD)
    if len(parts) not in (3, 4):
        raise ValueError(f"grab value {value!r} does not have 3 or 4 '{FIELD}'-separated fields")
    seq, amount_cents, at_ms = (_int(part, value) for part in parts[:3])
    return Grab(seq, amount_cents, at_ms, parts[3] if len(parts) == 4 else "")


def share_value(seq: int, amount_cents: int) -> str:
    """A queued share of a rebuilt packet, ``amount_cents|seq``: the grab that takes it gets
    that seq (the share's place in the commitment), not the next one in line."""
    return FIELD.join((str(amount_cents), str(seq)))


# -- ledger business keys -------------------------------------------------------------


def _key(kind: str, *parts: str) -> str:
    return KEY.join((kind, *parts))


def _key_sql(kind: str, *parts: SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """SQL `'kind:' || part || ':' || ...`, the same string as _key() over column values."""
    expression: SQLColumnExpression[str] = literal(kind + KEY, String)
    for i, part in enumerate(parts):
        if i:
            expression = expression + literal(KEY, String)
        expression = expression + part
    return expression


def grab_credit_key(packet_id: str, user_id: str) -> str:
    """The business key of the ledger credit for one grab."""
    return _key(GRAB_CREDIT, packet_id, user_id)


def grab_credit_key_sql(
    packet_id: SQLColumnExpression[str], user_id: SQLColumnExpression[str]
) -> SQLColumnExpression[str]:
    """grab_credit_key() as an SQL expression over columns (e.g. GrabRow's)."""
    return _key_sql(GRAB_CREDIT, packet_id, user_id)


def refund_key(packet_id: str) -> str:
    """The business key of the sender's refund credit for an expired packet."""
    return _key(REFUND, packet_id)


def refund_key_sql(packet_id: SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """refund_key() as an SQL expression over a column."""
    return _key_sql(REFUND, packet_id)


def packet_debit_key(packet_id: str) -> str:
    """The business key of the sender's debit for a sent packet."""
    return _key(PACKET_DEBIT, packet_id)


def packet_debit_key_sql(packet_id: SQLColumnExpression[str]) -> SQLColumnExpression[str]:
    """packet_debit_key() as an SQL expression over a column."""
    return _key_sql(PACKET_DEBIT, packet_id)


def deposit_key(reference: str) -> str:
    """The business key of a deposit, so one reference credits once."""
    return _key(DEPOSIT, reference)


class BusinessKey(NamedTuple):
    """A parsed ledger business key: its kind and the ids it names."""

    kind: str  # GRAB_CREDIT, REFUND, PACKET_DEBIT or DEPOSIT
    packet_id: str | None = None
    user_id: str | None = None
    reference: str | None = None


def parse_business_key(key: str) -> BusinessKey:
    """A ledger business key built by this module; anything else raises ValueError."""
    kind, *parts = key.split(KEY)
    names = _KEY_PARTS.get(kind)
    if names is None or len(parts) != len(names) or not all(parts):
        raise ValueError(f"{key!r} is not a ledger business key")
    return BusinessKey(kind, **dict(zip(names, parts, strict=True)))
