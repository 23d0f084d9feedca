"""Every event type of the feed (and of webhooks): when it is written and its `data` fields.

The one list a reader gets: docs/api.md and docs/webhooks.md are generated from it
(scripts/event_docs.py), and tests/test_event_types.py holds it to the events the engines
record, so a type or a field added to an engine without a line here fails there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataField:
    """One field of an event's `data`: its name, JSON type and meaning."""

    name: str
    type: str
    meaning: str


@dataclass(frozen=True)
class EventType:
    """One event type: its name (the event's `type`), when it is written, its data fields."""

    name: str
    when: str
    data: tuple[DataField, ...]


# -- fields several types share -----------------------------------------------------------

_ACTIVITY = DataField("activity_id", "id", "the activity")
_TEAM = DataField("team_id", "id", "the team")
_USER = DataField("user_id", "id", "the user")
_ORDER = DataField("order_id", "string or null", "the shop's order, null when none was given")
_MEMBERS = DataField("members", "list of {user_id, order_id}", "every member, in joining order")
_QUEUED_AT = DataField("queued_at", "timestamp", "when the entry joined the line")
_LINE_TEAM = DataField(
    "team_id", "id or null", "the team waited for, null for an entry waiting for any team"
)
_TEAM_VERSION = DataField("version", "integer", "the team's version after the change")
_PACKET = DataField("packet_id", "id", "the packet")
_SENDER = DataField("sender_id", "id", "the sender")
_PACKET_VERSION = DataField("version", "integer", "the packet's version after the change")

VERSIONS = (
    "A `version` is its team's or packet's version after the change: drop an event whose "
    "version is not newer than the one you hold. Events recorded before versions have none."
)
"""What every `version` field means, said once beside the table."""

_TEAM_EVENTS = (
    EventType(
        "team.opened",
        "a team is opened; its leader is member 1",
        (_ACTIVITY, _TEAM, DataField("leader_id", "id", "the leader"), _ORDER, _TEAM_VERSION),
    ),
    EventType(
        "team.member_joined",
        "a paid confirm turned a seat lock into membership",
        (_ACTIVITY, _TEAM, _USER, _ORDER, _TEAM_VERSION),
    ),
    EventType(
        "team.formed",
        "the last seat was confirmed, or the deadline formed the team by virtual completion",
        (
            _ACTIVITY,
            _TEAM,
            _MEMBERS,
            DataField(
                "virtual_seats",
                "integer",
                "seats counted as filled by virtual completion, 0 for a team that filled up",
            ),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "team.failed",
        "an open team ended without forming; a seat lock live then ends with it, unrecorded",
        (
            _ACTIVITY,
            _TEAM,
            DataField("members", "list of {user_id, order_id}", "the members to refund"),
            DataField(
                "reason",
                "string",
                "`deadline` (its time ran out), `dissolved` (an admin) or `abandoned` "
                "(its last member left)",
            ),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "team.member_left",
        "a member the shop refunded left an open team; the seat is free",
        (
            _ACTIVITY,
            _TEAM,
            _USER,
            _ORDER,
            DataField("reason", "string or null", "the shop's reason"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "team.member_refunded",
        "the shop refunded a member of a formed team; the member stays listed",
        (
            _ACTIVITY,
            _TEAM,
            _USER,
            _ORDER,
            DataField("reason", "string or null", "the shop's reason"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "team.leader_changed",
        "the leader left; the earliest remaining member leads",
        (
            _ACTIVITY,
            _TEAM,
            DataField("leader_id", "id", "the new leader"),
            DataField("previous_leader_id", "id", "the leader who left"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "lock.expired",
        "a seat lock's time ran out before a confirm (at its expiry, whoever noticed)",
        (
            _ACTIVITY,
            _TEAM,
            _USER,
            DataField("locked_at", "timestamp", "when the lock was taken"),
            DataField("expired_at", "timestamp", "when it expired"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "lock.extended",
        "a seat lock was extended: it now expires later",
        (
            _ACTIVITY,
            _TEAM,
            _USER,
            DataField("locked_at", "timestamp", "when the lock was taken"),
            DataField("expires_at", "timestamp", "its new expiry"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "lock.offered",
        "the waitlist gave the head of its line a seat lock",
        (
            _ACTIVITY,
            _TEAM,
            _USER,
            _QUEUED_AT,
            DataField("locked_at", "timestamp", "when the lock was taken"),
            DataField("expires_at", "timestamp", "when it expires unless confirmed"),
            _TEAM_VERSION,
        ),
    ),
    EventType(
        "waitlist.dropped",
        "a waitlist entry ended without a seat: its user may no longer take one there",
        (
            _ACTIVITY,
            _LINE_TEAM,
            _USER,
            _QUEUED_AT,
            DataField(
                "reason",
                "string",
                "`blocked`, `member`, `left`, `limit`, `locked`, `team_formed` or `team_failed`",
            ),
        ),
    ),
    EventType(
        "waitlist.expired",
        "a waitlist entry's time ran out before an offer",
        (_ACTIVITY, _LINE_TEAM, _USER, _QUEUED_AT),
    ),
)

_PACKET_EVENTS = (
    EventType(
        "packet.sent",
        "a packet was sent: the sender's account is debited",
        (
            _PACKET,
            _SENDER,
            DataField("amount_cents", "integer", "the packet's amount"),
            DataField("count", "integer", "how many shares"),
            DataField("strategy", "string", "how the shares are split"),
            DataField("expires_in_s", "integer", "its lifetime"),
            DataField("message", "string or null", "the sender's message"),
            DataField("recipients_count", "integer", "users it is limited to, 0 for anyone"),
            DataField("sender_may_grab", "boolean", "whether the sender may grab a share"),
            DataField("password_protected", "boolean", "whether a grab needs a password"),
            DataField("shares_sha256", "string", "the commitment to the shares"),
            _PACKET_VERSION,
        ),
    ),
    EventType(
        "packet.sold_out",
        "the last share was grabbed",
        (_PACKET, _SENDER, _PACKET_VERSION),
    ),
    EventType(
        "packet.withdrawn",
        "the sender took the packet back; its `packet.refunded` follows",
        (_PACKET, _SENDER, _PACKET_VERSION),
    ),
    EventType(
        "packet.refunded",
        "the rest of an expired or withdrawn packet went back to the sender; its last event",
        (
            _PACKET,
            _SENDER,
            DataField("refunded_cents", "integer", "the amount given back"),
            DataField("ungrabbed_count", "integer", "the shares nobody grabbed"),
            DataField("reason", "string", "`expired` or `withdrawn`"),
            _PACKET_VERSION,
        ),
    ),
)

_WEBHOOK_EVENTS = (
    EventType(
        "endpoint.disabled",
        "a webhook endpoint was disabled: it answered 410, or failed for too long",
        (
            DataField("endpoint_id", "id", "the endpoint"),
            DataField("reason", "string", "`gone` (a 410) or `failing`"),
        ),
    ),
)

EVENT_TYPES: dict[str, EventType] = {
    event.name: event for event in (*_TEAM_EVENTS, *_PACKET_EVENTS, *_WEBHOOK_EVENTS)
}
"""Every event type of the feed by name, in the order the docs list them."""
