"""The refusals that concern the user rather than the team, raised from a script's reply."""

from __future__ import annotations

from typing import NoReturn

from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.scripts import TeamReply


def refuse_for_user(reply: TeamReply, user_id: str) -> None:
    """Raise for the refusals that concern the user rather than the team (one of the
    activity's limits reached, a blocked user); return for any other reply."""
    if reply.code is TeamCode.USER_LIMIT_REACHED:
        refuse_over_limit(user_id, reply)
    if reply.code is TeamCode.USER_BLOCKED:
        refuse_blocked(user_id)


def refuse_over_limit(user_id: str, reply: TeamReply) -> NoReturn:
    """409 user_limit_reached from a script's {limit, current, limit name}."""
    raise_for(
        reply.code,
        f"user {user_id!r} is at the activity's {reply.limit_name} limit "
        f"({reply.current} of {reply.limit})",
        limit=reply.limit,
        current=reply.current,
        limit_name=reply.limit_name,
    )


def refuse_blocked(user_id: str) -> NoReturn:
    """403 user_blocked: an admin blocked the user (the script found them in the blocklist)."""
    raise_for(TeamCode.USER_BLOCKED, f"user {user_id!r} is blocked", user_id=user_id)
