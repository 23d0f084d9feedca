"""One exception tree: every error the API can answer, with its HTTP status and stable code.

A status sits on its class so that subclasses inherit it (every Conflict is a 409) and
SPEC.md's table reads off the tree; the problem+json body an error becomes is the API
layer's (groupbuy/api/problems.py, `problem_body`)."""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, NoReturn


class GroupBuyError(Exception):
    """Base of every error the service reports to a client as problem+json."""

    status_code: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"
    title: ClassVar[str] = "Bad request"

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra


class InvalidRequest(GroupBuyError):
    status_code, code, title = 422, "invalid_request", "Invalid request"


class Unauthorized(GroupBuyError):
    status_code, code, title = 401, "unauthorized", "Missing or wrong API key"


class BadSignature(Unauthorized):
    code, title = "bad_signature", "Missing, wrong, stale or replayed request signature"


class Forbidden(GroupBuyError):
    status_code, code, title = 403, "forbidden", "This key's role may not call this endpoint"


class UserBlocked(Forbidden):
    code, title = "user_blocked", "An admin has blocked this user"


class NotARecipient(Forbidden):
    code, title = "not_a_recipient", "The packet is for its recipients only"


class SenderCannotGrab(Forbidden):
    code, title = "sender_cannot_grab", "The sender may not grab their own packet"


class WrongPassword(Forbidden):
    code, title = "wrong_password", "The packet's password is missing or wrong"


class PasswordLocked(Forbidden):
    code, title = "password_locked", "Too many wrong passwords for this packet"


class NotTheSender(Forbidden):
    code, title = "not_the_sender", "Only the packet's sender may do this"


class PayloadTooLarge(GroupBuyError):
    status_code, code, title = 413, "payload_too_large", "Request body too large"


class RequestTimeout(GroupBuyError):
    status_code, code, title = 408, "request_timeout", "The request body arrived too slowly"


class HeadersTooLarge(GroupBuyError):
    status_code, code, title = 431, "headers_too_large", "Request Header Fields Too Large"


class UnsupportedMediaType(GroupBuyError):
    status_code, code, title = 415, "unsupported_media_type", "Request body is not JSON"


class NotFound(GroupBuyError):
    status_code, code, title = 404, "not_found", "Not found"


class ActivityNotFound(NotFound):
    code, title = "activity_not_found", "Activity not found"


class TeamNotFound(NotFound):
    code, title = "team_not_found", "Team not found"


class NotAMember(NotFound):
    code, title = "not_a_member", "The user is not a member of this team"


class NoLock(NotFound):
    code, title = "no_lock", "The user holds no seat lock in this activity"


class PacketNotFound(NotFound):
    code, title = "packet_not_found", "Red packet not found"


class EndpointNotFound(NotFound):
    code, title = "endpoint_not_found", "Webhook endpoint not found"


class NotGrabbed(NotFound):
    code, title = "not_grabbed", "The user has not grabbed this packet"


class DeliveryNotFound(NotFound):
    code, title = "delivery_not_found", "Webhook delivery not found"


class NotWaiting(NotFound):
    code, title = "not_waiting", "The user is not waiting in this activity's line"


class MethodNotAllowed(GroupBuyError):
    status_code, code, title = 405, "method_not_allowed", "Method not allowed"


class Conflict(GroupBuyError):
    status_code, code, title = 409, "conflict", "Conflicts with an existing resource"


class TeamFull(Conflict):
    code, title = "team_full", "Every seat of the team is taken or locked"


class WaitlistFull(Conflict):
    code, title = "waitlist_full", "The activity's waitlist is at its max_len"


class AlreadyLocked(Conflict):
    code, title = "already_locked", "The user holds a live seat lock in this activity"


class AlreadyMember(Conflict):
    code, title = "already_member", "The user is already a member of this team"


class TeamFormed(Conflict):
    code, title = "team_formed", "The team is already formed"


class TeamFailed(Conflict):
    code, title = "team_failed", "The team failed: it did not form (deadline, dissolved, abandoned)"


class ActivityClosed(Conflict):
    code, title = "activity_closed", "The activity is closed: it takes no new team or lock"


class ActivityNotStarted(Conflict):
    code, title = "activity_not_started", "The activity's sale has not started yet"


class ActivityEnded(Conflict):
    code, title = "activity_ended", "The activity's sale has ended: it takes no new team or lock"


class ActivitySoldOut(Conflict):
    code, title = "activity_sold_out", "Every unit of the activity's stock is held"


class OrderMismatch(Conflict):
    code, title = "order_mismatch", "The member joined with another order"


class LeftTeam(Conflict):
    code, title = "left_team", "The user left this team and may not take a seat in it again"


class NoTeamAvailable(Conflict):
    code, title = "no_team_available", "No open team of the activity has a free seat"


class LockRequired(Conflict):
    code, title = "lock_required", "The user holds no unexpired lock on this team"


class UserLimitReached(Conflict):
    code, title = "user_limit_reached", "The user has reached a limit of the activity"


class LimitExceeded(Conflict):
    code, title = "limit_exceeded", "The send would pass one of the sender's daily caps"


class InsufficientFunds(Conflict):
    code, title = "insufficient_funds", "The sender's balance is lower than the packet's amount"


class ReplayFailed(Conflict):
    code, title = "replay_failed", "The dead letter's record still cannot be applied"


class SoldOut(Conflict):
    code, title = "sold_out", "Every share of the packet has been grabbed"


class Expired(GroupBuyError):
    status_code, code, title = 410, "expired", "The packet has expired"


class Withdrawn(GroupBuyError):
    status_code, code, title = 410, "withdrawn", "The sender withdrew the packet"


class PacketEnded(Conflict):
    code, title = "packet_ended", "The packet has ended: sold out or expired"


class RateLimited(GroupBuyError):
    status_code, code, title = 429, "rate_limited", "Too many requests; retry after a while"


class Unavailable(GroupBuyError):
    status_code, code, title = 503, "unavailable", "A backing service is unavailable"


class RedisUnavailable(Unavailable):
    code, title = "redis_unavailable", "Redis is unreachable; retry later"


class RedisOutOfMemory(Unavailable):
    code, title = "redis_out_of_memory", "Redis is over its memory limit; nothing was applied"


class RedisReplicationTimeout(Unavailable):
    code, title = (
        "redis_replication_timeout",
        "Fewer replicas than [redis] wait_replicas confirmed the write in time; it is applied "
        "on the primary, and a retry answers the same",
    )


class DatabaseUnavailable(Unavailable):
    code, title = "database_unavailable", "The database is unreachable; retry later"


class InternalError(GroupBuyError):
    status_code, code, title = 500, "internal_error", "Internal error"


def every_error() -> list[type[GroupBuyError]]:
    """One class per code the API can answer (the first met of a code), by status then code:
    what the problem documentation lists."""
    found: dict[str, type[GroupBuyError]] = {}
    pending: list[type[GroupBuyError]] = [GroupBuyError]
    while pending:
        cls = pending.pop(0)
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return sorted(found.values(), key=lambda cls: (cls.status_code, cls.code))


def raise_for(code: Enum, detail: str | None = None, **extra: Any) -> NoReturn:
    """Raise the API error a script's refusal code stands for: the one whose problem code
    is the code's name, lower-cased (TEAM_FULL: team_full). A code without one is a bug."""
    error = _BY_CODE.get(code.name.lower())
    if error is None:
        raise RuntimeError(f"script code {code!r} has no error mapping")
    raise error(detail, **extra)


_BY_CODE = {cls.code: cls for cls in every_error()}
