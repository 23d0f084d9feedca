"""The rules of reconciliation: what must agree, as pure functions over what was read.

groupbuy/ops/reconcile/reconciler.py reads Redis and SQL; these functions compare and name every
disagreement with a `kind` from KINDS, the ids it concerns and the numbers involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from groupbuy.redpacket.commitment import Commitment, holds

Mismatch = dict[str, Any]
# A grab row and its ledger credit: user -> (grab cents, credit's user, credit's cents).
GrabDetails = dict[str, tuple[int, str | None, int | None]]

KINDS = {
    # a packet in SQL (SPEC §4.3) and its ledger entries (§4.4, §4.5)
    "packet_grab_count": "more grab rows than the packet has shares",
    "packet_grab_amount": "a grab row of less than 1 cent",
    "packet_sold_out": "sold out, but the grab rows are not `count` grabs summing to the amount",
    "packet_expired": "expired or withdrawn, but grabs + refunded != amount",
    "packet_overdrawn": "active, but the grab rows sum to more than the amount",
    "packet_debit": "the sender's packet_debit entry is missing or is not -amount",
    "refund_entry": "refund entry missing or != refunded_cents, or present on an unexpired packet",
    "grab_credit_missing": "a grab row without its ledger credit",
    "grab_credit_mismatch": "a grab's ledger credit has another amount or user",
    "credit_without_grab": "a grab credit in the ledger without its grab row",
    # a packet's commitment (SPEC §4.14)
    "packet_commitment": "a grab row did not get the committed share of its seq (the first "
    "such seq)",
    "packet_commitment_digest": "the kept shares and salt do not hash to shares_sha256",
    # a packet in Redis, and Redis against SQL once its outbox stream is empty
    "redis_packet_missing": "active in SQL, but unknown to Redis",
    "redis_packet_sum": "in Redis, remaining_cents + grabs != amount",
    "redis_grab_count": "in Redis, the number of grabs != count - remaining_count",
    "redis_packet_params": "sender, amount or count differ between Redis and SQL",
    "redis_status": "the status differs between Redis and SQL",
    "redis_refund": "the refunded amount differs between Redis and SQL",
    "redis_grab_missing_in_sql": "a grab in Redis without a grab row",
    "redis_grab_dead_lettered": "a grab in Redis without a grab row because SQL refused its "
    "record: it is kept in the dead letters (dead_letter_id)",
    "sql_grab_missing_in_redis": "a grab row unknown to Redis",
    "grab_acknowledged_unrecorded": "answered `grabbed`, but Redis lost the grab before SQL had "
    "it (recorded_cents: what the user holds now, if they grabbed again after the rebuild)",
    "grab_dead_lettered": "answered `grabbed`, but SQL refused the grab's record: it is kept "
    "in the dead letters (dead_letter_id) for an operator",
    "redis_grab_amount": "a grab's amount differs between Redis and SQL",
    # a team (SPEC §4.1), then Redis against SQL once the activity's outbox is empty
    "team_overfull": "more member rows than seats",
    "team_duplicate_seq": "two member rows share a seq",
    "team_formed_size": "formed, but without exactly `size` member rows (or, under virtual "
    "completion, at least its min_members)",
    "redis_team_missing": "open in SQL, but unknown to Redis",
    "redis_team_member_count": "in Redis, member_count != the number of members",
    "redis_team_status": "the status differs between Redis and SQL",
    "redis_member_missing_in_sql": "a member in Redis without a member row",
    "sql_member_missing_in_redis": "a member row unknown to Redis",
    "member_order": "a member's order id differs between Redis and SQL",
    # an activity's stock (SPEC §4.12)
    "stock_overheld": "in Redis, members + live locks > stock",
    "stock_oversold": "in SQL, members of open and formed teams (less the refunded) > stock",
    "redis_stock": "the stock differs between Redis and SQL",
    # an account (SPEC §4.4)
    "account_balance": "balance_cents != the sum of the account's ledger entries",
}


# The statuses whose rest went back to the sender.
_REFUNDED = ("expired", "withdrawn")


@dataclass(frozen=True)
class Live:
    """One packet or team as read from Redis; `fields` is empty when Redis let it go."""

    fields: dict[str, str]
    entries: dict[str, Any]  # packet grabs: user -> cents; team members: user -> order id
    pending: int  # records still in its outbox stream


class Findings(list[Mismatch]):
    """Mismatches about one subject: each carries its ids, its numbers and a description."""

    def __init__(self, **ids: Any) -> None:
        super().__init__()
        self._ids = ids

    def add(self, kind: str, **numbers: Any) -> None:
        self.append({"kind": kind, **self._ids, **numbers, "detail": KINDS[kind]})


def as_int(value: Any) -> int | None:
    """An integer from Redis or SQL, or None for a missing or malformed value."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def packet_sql(p: dict[str, Any], grabs: GrabDetails) -> Findings:
    """One packet's SQL row, grab totals and ledger entries (`grabs` details bad credits)."""
    found = Findings(packet_id=p["packet_id"])
    amount, count, status = p["amount_cents"], p["count"], p["status"]
    n, grabbed, refunded = p["grabs"], p["grabbed"], p["refunded_cents"]
    if n > count:
        found.add("packet_grab_count", grabs=n, count=count)
    if n and p["smallest"] < 1:
        found.add("packet_grab_amount", smallest_cents=p["smallest"])
    if status == "sold_out" and (grabbed != amount or n != count):
        found.add(
            "packet_sold_out", grabs=n, count=count, grabbed_cents=grabbed, amount_cents=amount
        )
    if status in _REFUNDED and grabbed + refunded != amount:
        found.add(
            "packet_expired", grabbed_cents=grabbed, refunded_cents=refunded, amount_cents=amount
        )
    if status in ("active", "pending") and grabbed > amount:
        found.add("packet_overdrawn", grabbed_cents=grabbed, amount_cents=amount)
    if (p["debit_user"], p["debit_cents"]) != (p["sender_id"], -amount):
        found.add(
            "packet_debit",
            user_id=p["sender_id"],
            entry_cents=p["debit_cents"],
            amount_cents=amount,
        )
    expected = (p["sender_id"], refunded) if status in _REFUNDED else (None, None)
    if (p["refund_user"], p["refund_cents"]) != expected:
        found.add(
            "refund_entry", status=status, refunded_cents=refunded, entry_cents=p["refund_cents"]
        )
    if p["matched"] != n:
        for user_id, (cents, credit_user, credit_cents) in sorted(grabs.items()):
            if credit_cents is None:
                found.add("grab_credit_missing", user_id=user_id, grab_cents=cents)
            elif (credit_user, credit_cents) != (user_id, cents):
                found.add(
                    "grab_credit_mismatch",
                    user_id=user_id,
                    grab_cents=cents,
                    credit_cents=credit_cents,
                    credit_user_id=credit_user,
                )
    return found


def packet_commitment(
    packet_id: str, commitment: Commitment, digest: str | None, grabs: Sequence[tuple[int, int]]
) -> Findings:
    """A packet's grab rows (seq, amount) against the shares committed at send (the i-th
    share is seq i), and the kept shares against the digest answered at send."""
    found = Findings(packet_id=packet_id)
    if commitment.sha256 != digest:
        found.add("packet_commitment_digest", shares_sha256=digest)
    for seq, cents in grabs:
        if not holds(commitment.shares, [(seq, cents)]):
            found.add("packet_commitment", seq=seq, grab_cents=cents)
            break
    return found


def packet_redis(
    p: dict[str, Any], live: Live, grabs: GrabDetails, dead: dict[str, int] | None = None
) -> Findings:
    """Redis's own arithmetic; then Redis against SQL, unless records are still waiting
    (`dead`: user -> dead letter id of the packet's grab records SQL refused)."""
    found = Findings(packet_id=p["packet_id"])
    f = live.fields
    if not f:
        if p["status"] == "active" and not live.pending:
            found.add("redis_packet_missing")
        return found
    amount, count = as_int(f.get("amount")), as_int(f.get("count"))
    left_cents, left_count = as_int(f.get("remaining_cents")), as_int(f.get("remaining_count"))
    redis_sum = sum(v for v in live.entries.values() if v is not None)
    if left_cents is None or left_cents + redis_sum != amount:
        found.add(
            "redis_packet_sum",
            remaining_cents=left_cents,
            grabbed_cents=redis_sum,
            amount_cents=amount,
        )
    if count is None or left_count is None or len(live.entries) != count - left_count:
        found.add(
            "redis_grab_count", grabs=len(live.entries), count=count, remaining_count=left_count
        )
    if live.pending:
        return found
    if (f.get("sender_id"), amount, count) != (p["sender_id"], p["amount_cents"], p["count"]):
        found.add(
            "redis_packet_params", redis_amount_cents=amount, sql_amount_cents=p["amount_cents"]
        )
    sql_status = "active" if p["status"] == "pending" else p["status"]  # pending: going live
    redis_refunded = as_int(f.get("refunded"))
    if f.get("status") != sql_status:
        found.add("redis_status", redis_status=f.get("status"), sql_status=p["status"])
    elif sql_status in _REFUNDED and redis_refunded != p["refunded_cents"]:
        found.add("redis_refund", redis_cents=redis_refunded, sql_cents=p["refunded_cents"])
    sql = {user: cents for user, (cents, _user, _cents) in grabs.items()}
    for user_id in sorted(live.entries.keys() | sql.keys()):
        redis_cents, sql_cents = live.entries.get(user_id), sql.get(user_id)
        if user_id not in sql and dead and user_id in dead:
            found.add(
                "redis_grab_dead_lettered",
                user_id=user_id,
                redis_cents=redis_cents,
                dead_letter_id=dead[user_id],
            )
            continue
        if user_id not in sql:
            kind = "redis_grab_missing_in_sql"
        elif user_id not in live.entries:
            kind = "sql_grab_missing_in_redis"
        elif redis_cents != sql_cents:
            kind = "redis_grab_amount"
        else:
            continue
        found.add(kind, user_id=user_id, redis_cents=redis_cents, sql_cents=sql_cents)
    return found


def team(t: dict[str, Any], live: Live, members: dict[str, str | None]) -> Findings:
    """One team's member rows; then Redis against SQL, unless records are still waiting."""
    found = Findings(activity_id=t["activity_id"], team_id=t["team_id"])
    n, size, status, f = t["members"], t["size"], t["status"], live.fields
    if n > size:
        found.add("team_overfull", members=n, size=size)
    if t["seqs"] != n:
        found.add("team_duplicate_seq", members=n, seqs=t["seqs"])
    virtual_min = t.get("virtual_min")
    formed_short = virtual_min is not None and virtual_min <= n < size
    if status == "formed" and n != size and not formed_short:
        found.add("team_formed_size", members=n, size=size)
    if not f:
        if status == "open" and not live.pending:
            found.add("redis_team_missing")
        return found
    member_count = as_int(f.get("member_count"))
    if member_count != len(live.entries):
        found.add("redis_team_member_count", member_count=member_count, members=len(live.entries))
    if live.pending:
        return found
    if f.get("status") != status:
        found.add("redis_team_status", redis_status=f.get("status"), sql_status=status)
    for user_id in sorted(live.entries.keys() | members.keys()):
        if user_id not in members:
            kind = "redis_member_missing_in_sql"
        elif user_id not in live.entries:
            kind = "sql_member_missing_in_redis"
        elif live.entries[user_id] != members[user_id]:
            kind = "member_order"
        else:
            continue
        found.add(
            kind,
            user_id=user_id,
            redis_order_id=live.entries.get(user_id),
            sql_order_id=members.get(user_id),
        )
    return found


@dataclass(frozen=True)
class Held:
    """An activity's stock as read from Redis: its stock (None for no cap) and the units held,
    its members (the counts hash's) and live locks."""

    stock: int | None
    members: int
    locks: int


def stock(activity_id: str, sql_stock: int | None, sql_members: int, live: Held | None) -> Findings:
    """One activity's stock (SPEC §4.12): SQL's member rows of its open and formed teams (less
    the refunded, `sql_members`) and, when Redis has its copy (`live`), Redis's members +
    live locks, each within the stock; and Redis's stock equal to SQL's."""
    found = Findings(activity_id=activity_id)
    if sql_stock is not None and sql_members > sql_stock:
        found.add("stock_oversold", members=sql_members, stock=sql_stock)
    if live is None:
        return found
    if live.stock != sql_stock:
        found.add("redis_stock", redis_stock=live.stock, sql_stock=sql_stock)
    if live.stock is not None and live.members + live.locks > live.stock:
        found.add("stock_overheld", members=live.members, live_locks=live.locks, stock=live.stock)
    return found


def accounts(balances: dict[str, int], totals: dict[str, int]) -> Findings:
    """Every account's balance against the sum of its entries (a missing account is 0)."""
    found = Findings()
    for user_id in sorted(balances.keys() | totals.keys()):
        balance, total = balances.get(user_id), totals.get(user_id, 0)
        if (balance or 0) != total:
            found.add("account_balance", user_id=user_id, balance_cents=balance, ledger_cents=total)
    return found
