"""Each packet script called directly through its wrapper (no service), on fakeredis and on a
real redis-server; the replies arrive parsed, so a field out of place fails here."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.redpacket import records as packet_records
from groupbuy.redpacket.admission import packet_admit, packet_unadmit
from groupbuy.redpacket.codec import share_value
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.read import packet_read
from groupbuy.redpacket.recovery import packet_restore
from groupbuy.redpacket.specs import PacketReply
from groupbuy.redpacket.sweeps import packet_expire
from groupbuy.redpacket.withdraw import packet_withdraw
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import Reply, script_source
from groupbuy.storage.typedrecords import record_keys
from tests.support.packet_scripts import (
    EXISTING,
    EXPIRED,
    OK,
    PACKET_NOT_FOUND,
    PID,
    RETENTION_MS,
    SOLD_OUT,
    USER_BLOCKED,
    WINDOW_MS,
    Harness,
    plain_terms,
)


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    return harness


def over_cap(limit: str, current: int, cap: int) -> PacketReply:
    """packet_admit's LIMIT_EXCEEDED reply."""
    return Reply(PacketCode.LIMIT_EXCEEDED, limit=limit, current=current, cap=cap)


def share(reply: PacketReply) -> tuple[int, int, int, int]:
    """A `grabbed` reply's (amount_cents, remaining_count, seq, epoch); else the test fails."""
    assert reply.code is PacketCode.OK, reply
    return reply.amount_cents, reply.remaining_count, reply.seq, reply.epoch


async def test_create_is_idempotent_and_sets_up_the_group(h: Harness) -> None:
    assert await h.create([5, 3, 2]) == OK
    assert await h.create([9, 9, 9]) == EXISTING
    assert await h.redis.lrange(h.keys.shares, 0, -1) == ["5", "3", "2"]
    groups = await h.redis.xinfo_groups(h.keys.outbox)
    assert [g["name"] for g in groups] == ["writers"]
    ttl = await h.redis.pttl(h.keys.hash)
    assert 60_000 < ttl <= 60_000 + RETENTION_MS


async def test_create_handles_ten_thousand_shares(h: Harness) -> None:
    shares = [1] * 10_000
    assert await h.create(shares) == OK
    assert await h.redis.llen(h.keys.shares) == 10_000


async def test_grab_outcomes(h: Harness) -> None:
    assert await h.grab("u1") == PACKET_NOT_FOUND
    await h.create([5, 3, 2])
    # {OK, amount, remaining, seq, epoch, now_ms}
    assert share(await h.grab("u1")) == (5, 2, 1, 0)
    assert await h.grab("u1") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    assert share(await h.grab("u2")) == (3, 1, 2, 0)
    assert share(await h.grab("u3")) == (2, 0, 3, 0)
    assert await h.grab("u4") == SOLD_OUT
    assert await h.grab("u2") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=3)
    records = await h.records()
    assert [r["type"] for r in records] == ["grab", "grab", "grab", "packet.sold_out"]
    assert [(r["user_id"], r["amount_cents"], r["seq"]) for r in records[:3]] == [
        ("u1", "5", "1"),
        ("u2", "3", "2"),
        ("u3", "2", "3"),
    ]
    packet = await h.redis.hgetall(h.keys.hash)
    assert packet["status"] == "sold_out" and packet["remaining_cents"] == "0"
    assert await h.redis.pttl(h.keys.grabs) > 0  # the grabs hash expires with the packet


async def test_a_resent_grab_answers_what_its_first_run_did(h: Harness) -> None:
    await h.create([5, 3, 2], ttl_ms=600_000)
    first = await h.grab("u1", token="req-A")
    assert share(first) == (5, 2, 1, 0)
    # The same request token again (a resend of the same call): the same answer, nothing new.
    assert await h.grab("u1", token="req-A") == first
    # Another request of the same user is a repeat: already_grabbed with the same amount.
    assert await h.grab("u1", token="req-B") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    assert share(await h.grab("u2", token="req-C")) == (3, 1, 2, 0)
    last = await h.grab("u3", token="req-D")
    assert share(last) == (2, 0, 3, 0)
    # Resends after later grabs and after the sell-out still answer as their first run did.
    assert await h.grab("u1", token="req-A") == first
    assert await h.grab("u3", token="req-D") == last
    records = await h.records()
    assert [r["type"] for r in records] == ["grab", "grab", "grab", "packet.sold_out"]
    packet = await h.redis.hgetall(h.keys.hash)
    assert packet["version"] == "5"  # created, three grabs, sold out: no change by a resend
    # Past the resend window the token no longer counts: a plain repeat.
    h.shift_ms += WINDOW_MS + 1
    assert await h.grab("u1", token="req-A") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)


async def test_a_blocked_user_grabs_nothing(h: Harness) -> None:
    await h.create([5, 3, 2])
    first = await h.grab("early", token="req-E")
    await h.redis.hset(h.keys.blocklist, mapping={"bad": "1|", "early": "1|"})
    assert await h.grab("bad") == USER_BLOCKED
    # What the user grabbed before the block is still answered, a resend too.
    assert await h.grab("early") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    assert await h.grab("early", token="req-E") == first
    assert [r["type"] for r in await h.records()] == ["grab"]
    assert await h.redis.llen(h.keys.shares) == 2
    await h.redis.hdel(h.keys.blocklist, "bad")
    assert share(await h.grab("bad")) == (3, 1, 2, 0)


async def test_expiry_closes_once_and_refunds_the_rest(h: Harness) -> None:
    await h.create([5, 3, 2], ttl_ms=10_000)
    await h.grab("u1")
    assert (await packet_expire(h.packets, PID)).code is PacketCode.NOT_DUE
    h.shift_ms += 10_000
    assert await packet_expire(h.packets, PID) == Reply(PacketCode.OK, refunded_cents=5)
    assert await packet_expire(h.packets, PID) == Reply(PacketCode.EXISTING, status="expired")
    assert await h.grab("u2") == EXPIRED
    assert await h.grab("u1") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    refunds = [r for r in await h.records() if r["type"] == "packet.refunded"]
    assert len(refunds) == 1 and refunds[0]["refunded_cents"] == "5"
    assert not await h.redis.exists(h.keys.shares)


async def test_a_grab_after_the_deadline_closes_the_packet_itself(h: Harness) -> None:
    await h.create([4, 4], ttl_ms=1_000)
    h.shift_ms += 1_000
    assert await h.grab("u1") == EXPIRED
    assert await packet_expire(h.packets, PID) == Reply(PacketCode.EXISTING, status="expired")
    assert [r["type"] for r in await h.records()] == ["packet.refunded"]


async def test_sold_out_packets_never_refund(h: Harness) -> None:
    await h.create([1], ttl_ms=1_000)
    await h.grab("u1")
    h.shift_ms += 5_000
    assert await packet_expire(h.packets, PID) == Reply(PacketCode.EXISTING, status="sold_out")
    assert "packet.refunded" not in [r["type"] for r in await h.records()]


async def test_read(h: Harness) -> None:
    assert await packet_read(h.packets, PID) == PACKET_NOT_FOUND
    await h.create([2, 1])
    await h.grab("u1")
    state = await packet_read(h.packets, PID)
    assert state.code is PacketCode.OK
    assert state.packet["remaining_count"] == "1"
    assert state.page[0] == "u1" and state.page[1].startswith("1|2|")
    assert state.total == 1 and state.now_ms > 0


async def test_outbox_ack_with_the_group(h: Harness) -> None:
    await h.create([1, 1])
    await h.grab("u1")
    stream, pending = h.keys.outbox, h.keys.pending
    batch = await h.redis.xreadgroup("writers", "c1", {stream: ">"})
    ids = [entry_id for entry_id, _ in batch[0][1]]
    assert await h.redis.zscore(pending, PID) == int(ids[0].split("-")[0])  # listed by the grab
    assert await h.scripts.call("outbox_ack", [stream, pending], ["writers", "0", PID, *ids]) == [
        1,
        0,
    ]
    assert await h.redis.exists(stream)  # kept: more grabs may come
    assert (await h.redis.xpending(stream, "writers"))["pending"] == 0
    assert await h.redis.zscore(pending, PID) is None  # nothing waits: out of the index


async def _restore(h: Harness, grabs: list[tuple[str, str]], shares: list[int]) -> PacketReply:
    """packet_restore of a 10-cent packet at epoch 1 (version 100) with these grabs and
    shares (as many shares as both), the shares given the seqs after the highest grab's."""
    now = await h.now_ms()
    flat = [part for grab in grabs for part in grab]
    after = max((int(v.split("|")[0]) for _u, v in grabs), default=0)
    queued = [share_value(seq, share) for seq, share in enumerate(shares, after + 1)]
    return await packet_restore(
        h.packets,
        PID,
        [*flat, *queued],
        sender_id="sender",
        amount_cents=10,
        count=len(grabs) + len(shares),
        strategy="double_mean",
        created_ms=now,
        expires_ms=now + 60_000,
        retention_ms=RETENTION_MS,
        **plain_terms(),
        epoch=1,
        version=100,
        grab_count=len(grabs),
    )


async def test_restore_rebuilds_once_and_new_grabs_carry_the_epoch(h: Harness) -> None:
    grabs = [("u1", "1|4|1000"), ("u3", "3|2|1002")]  # seq 2 never reached SQL
    assert await _restore(h, grabs, [3, 1]) == Reply(PacketCode.OK, status="active")
    assert await _restore(h, [], [1, 1, 1, 7]) == EXISTING  # nothing changed
    packet = await h.redis.hgetall(h.keys.hash)
    assert (packet["remaining_count"], packet["remaining_cents"], packet["epoch"]) == (
        "2",
        "4",
        "1",
    )
    assert packet["version"] == "100"
    assert await h.grab("u1") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=4)
    assert share(await h.grab("u4")) == (3, 1, 4, 1)
    assert share(await h.grab("u5")) == (1, 0, 5, 1)
    records = await h.records()
    assert [(r["type"], r.get("seq"), r["epoch"]) for r in records] == [
        ("grab", "4", "1"),
        ("grab", "5", "1"),
        ("packet.sold_out", None, "1"),
    ]
    assert records[-1]["version"] == "103"  # two grabs and the sold out after the rebuild
    assert await h.redis.zscore(h.keys.due, PID) is None  # sold out: not due any more


async def test_restore_of_a_fully_recorded_packet_records_its_end(h: Harness) -> None:
    grabs = [("u1", "1|6|1000"), ("u2", "2|4|1001")]
    assert await _restore(h, grabs, []) == Reply(PacketCode.OK, status="sold_out")
    assert [r["type"] for r in await h.records()] == ["packet.sold_out"]
    assert await h.grab("u3") == SOLD_OUT
    assert await h.redis.zscore(h.keys.due, PID) is None


async def test_packet_scripts_survive_script_flush(h: Harness) -> None:
    await h.create([1, 1])
    await h.redis.script_flush()
    assert share(await h.grab("u1"))[:2] == (1, 1)


async def test_every_packet_key_but_the_global_indexes_shares_one_slot(h: Harness) -> None:
    await h.create([1, 1])
    await h.grab("u1")
    keys = set(await h.redis.keys("*"))
    # The documented exceptions (docs/architecture.md, for Cluster): the two indexes, and
    # the blocked users hash, which exists once a user is blocked.
    indexes = {h.keys.pending, h.keys.due}
    # hash, shares, grabs, outbox, order, terms
    assert indexes <= keys and len(keys - indexes) == 6
    assert {k[k.index("{") + 1 : k.index("}")] for k in keys - indexes} == {f"p:{PID}"}


def test_lua_codes_mirror_the_python_enum() -> None:
    import re

    source = script_source("packet_read")
    lua: dict[str, int] = {}
    for names, values in re.findall(r"^local ([A-Z_, ]+) = ([\d, ]+)$", source, re.MULTILINE):
        for name, value in zip(names.split(","), values.split(","), strict=True):
            lua[name.strip()] = int(value)
    assert lua == {c.name: c.value for c in PacketCode}


def entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


async def test_the_pending_index_lists_a_packet_while_records_wait(h: Harness) -> None:
    stream, pending = h.keys.outbox, h.keys.pending
    await h.create([1, 1, 1])
    assert await h.redis.zscore(pending, PID) is None  # created: nothing waits yet
    await h.grab("u1")
    await h.grab("u2")
    first, second = [entry_id for entry_id, _ in await h.redis.xrange(stream)]
    assert await h.redis.zscore(pending, PID) == entry_ms(first)  # the oldest, not the newest
    keys = [stream, pending]
    assert await h.scripts.call("outbox_ack", keys, ["", "0", PID, first]) == [1, 1]
    assert await h.redis.zscore(pending, PID) == entry_ms(second)  # now the oldest left
    await h.redis.zrem(pending, PID)  # an entry lost: acking nothing puts it back
    assert await h.scripts.call("outbox_ack", keys, ["", "0", PID]) == [0, 1]
    assert await h.redis.zscore(pending, PID) == entry_ms(second)
    assert await h.scripts.call("outbox_ack", keys, ["", "0", PID, second]) == [1, 0]
    assert await h.redis.zscore(pending, PID) is None
    assert await h.scripts.call("outbox_ack", keys, ["", "1", PID]) == [0, 0]  # and the end
    assert not await h.redis.exists(stream)


async def test_outbox_read_answers_a_range_of_the_stream(h: Harness) -> None:
    stream = h.keys.outbox
    await h.create([1, 1, 1, 1])  # not sold out: three grab records
    for user in ("u1", "u2", "u3"):
        await h.grab(user)
    entries = await h.redis.xrange(stream)
    ids = [entry_id for entry_id, _ in entries]
    flat = [
        [entry_id, [x for pair in fields.items() for x in pair]] for entry_id, fields in entries
    ]
    for publish in ("0", "1"):  # publishing writes nothing a reader sees
        assert await h.scripts.call("outbox_read", [stream], ["-", "+", 10, publish]) == [3, flat]
    assert await h.scripts.call("outbox_read", [stream], [ids[1], ids[2], 10, "0"]) == [
        2,
        flat[1:],
    ]
    assert await h.scripts.call("outbox_read", [stream], ["-", ids[2], 1, "0"]) == [1, flat[:1]]
    assert await h.scripts.call("outbox_read", ["t:{p:none}:outbox"], ["-", "+", 10, "1"]) == [
        0,
        [],
    ]
    assert await h.redis.xlen(stream) == 3


async def test_the_due_index_lists_a_packet_while_it_is_active(h: Harness) -> None:
    due = h.keys.due
    await h.create([1, 1], ttl_ms=10_000)
    expires = int((await h.redis.hgetall(h.keys.hash))["expires_ms"])
    assert await h.redis.zscore(due, PID) == expires
    await h.redis.zrem(due, PID)  # lost: a check before the expiry puts it back
    assert (await packet_expire(h.packets, PID)).code is PacketCode.NOT_DUE
    assert await h.redis.zscore(due, PID) == expires
    h.shift_ms += 10_000
    assert (await packet_read(h.packets, PID)).code is PacketCode.OK  # the lazy expiry ends it
    assert await h.redis.zscore(due, PID) is None
    await h.redis.zadd(due, {PID: expires})  # a stale entry goes at the next check
    assert (await packet_expire(h.packets, PID)).code is PacketCode.EXISTING
    assert await h.redis.zscore(due, PID) is None
    await h.redis.zadd(due, {"gone": 1})  # so does one of a packet Redis no longer has
    assert await packet_expire(h.packets, "gone") == PACKET_NOT_FOUND
    assert await h.redis.zscore(due, "gone") is None


async def test_selling_out_leaves_the_due_index(h: Harness) -> None:
    await h.create([1, 1])
    await h.grab("u1")
    assert await h.redis.zscore(h.keys.due, PID) is not None
    await h.grab("u2")
    assert await h.redis.zscore(h.keys.due, PID) is None


async def test_admit_checks_the_block_and_counts_each_send_once(h: Harness) -> None:
    blocked, day = h.keys.blocklist, "t:{s:snd}:sent:1"

    async def admit(
        pid: str, amount: int, count_cap: int = 2, amount_cap: int = 0, token: str = "other"
    ) -> PacketReply:
        return await packet_admit(
            h.packets,
            blocked,
            day,
            sender_id="snd",
            packet_id=pid,
            amount_cents=amount,
            daily_count_cap=count_cap,
            daily_amount_cap=amount_cap,
            day_expire_at_ms=10**13,
            request_token=token,
        )

    assert await admit("a", 5, count_cap=0) == Reply(
        PacketCode.OK, counted=False
    )  # no cap: nothing counted
    assert not await h.redis.exists(day)
    assert await admit("a", 5, token="req-1") == Reply(PacketCode.OK, counted=True)
    # A resend of that call: counted by it; another request: counted once, not by this one.
    assert await admit("a", 5, token="req-1") == Reply(PacketCode.OK, counted=True)
    assert await admit("a", 5) == Reply(PacketCode.OK, counted=False)
    assert await admit("b", 7) == Reply(PacketCode.OK, counted=True)
    assert await admit("c", 1) == over_cap("sender_daily_count", 2, 2)
    assert await admit("c", 1, count_cap=0, amount_cap=12) == over_cap(
        "sender_daily_amount_cents", 12, 12
    )
    assert await h.redis.hgetall(day) == {
        "a": "5|req-1",
        "b": "7|other",
        "#count": "2",
        "#amount": "12",
    }
    assert await h.redis.pexpiretime(day) == 10**13

    assert await packet_unadmit(h.packets, day, "b") == Reply(PacketCode.OK, taken_back=True)
    assert await packet_unadmit(h.packets, day, "b") == Reply(PacketCode.OK, taken_back=False)
    assert await h.redis.hgetall(day) == {"a": "5|req-1", "#count": "1", "#amount": "5"}
    assert await admit("c", 1) == Reply(PacketCode.OK, counted=True)

    await h.redis.hset(blocked, "snd", "1|")
    assert await admit("d", 1) == USER_BLOCKED
    await h.redis.script_flush()
    assert await admit("d", 1) == USER_BLOCKED


async def test_outbox_bury_moves_an_entry_to_the_dead_letters_atomically(h: Harness) -> None:
    await h.create([1, 1, 1])
    await h.grab("u1")
    await h.grab("u2")
    stream, pending, dead = h.keys.outbox, h.keys.pending, Keys("t").dead_letters()
    batch = await h.redis.xreadgroup("writers", "c1", {stream: ">"})
    (first, fields), (second, _) = batch[0][1]
    args = ["writers", PID, "packets", "100"]
    await h.redis.script_flush()  # loaded again on first use
    assert await h.scripts.call("outbox_bury", [stream, pending, dead], [*args, first, "7"]) == [
        1,
        1,
    ]
    ((_letter_id, letter),) = await h.redis.xrange(dead)
    assert letter == {
        "stream": "packets",
        "owner_id": PID,
        "entry_id": first,
        "dead_letter_id": "7",
        **{f"field.{name}": value for name, value in fields.items()},
    }
    assert [entry_id for entry_id, _ in await h.redis.xrange(stream)] == [second]
    assert (await h.redis.xpending(stream, "writers"))["pending"] == 1  # only the other one
    assert await h.redis.zscore(pending, PID) == int(second.split("-")[0])  # scored by what is left
    # Again (a writer that died after the move): nothing more is moved or counted.
    assert await h.scripts.call("outbox_bury", [stream, pending, dead], [*args, first, "7"]) == [
        0,
        1,
    ]
    assert await h.redis.xlen(dead) == 1


async def _grab_until_sold_out(h: Harness) -> None:
    await h.create([5, 3])
    await h.grab("u1")
    await h.grab("u2")


async def _expire(h: Harness) -> None:
    await h.create([5, 3, 2], ttl_ms=10_000)
    await h.grab("u1")
    h.shift_ms += 10_000
    await packet_expire(h.packets, PID)


async def _grab_after_the_deadline(h: Harness) -> None:
    await h.create([4, 4], ttl_ms=1_000)
    h.shift_ms += 1_000
    await h.grab("u1")


async def _restore_recorded(h: Harness) -> None:
    await _restore(h, [("u1", "1|6|1000"), ("u2", "2|4|1001")], [])


async def _withdraw(h: Harness) -> None:
    await h.create([5, 3, 2])
    await h.grab("u1")
    await packet_withdraw(h.packets, PID, "sender")


EMITTING = {
    "packet_withdraw": (_withdraw, ["grab", "packet.withdrawn", "packet.refunded"]),
    "packet_grab": (_grab_until_sold_out, ["grab", "grab", "packet.sold_out"]),
    "packet_expire": (_expire, ["grab", "packet.refunded"]),
    "packet_grab late": (_grab_after_the_deadline, ["packet.refunded"]),
    "packet_restore": (_restore_recorded, ["packet.sold_out"]),
}


def test_the_emitting_scripts_cover_every_record_type() -> None:
    types = {kind for _run, kinds in EMITTING.values() for kind in kinds}
    assert types == set(packet_records.PACKET_RECORDS)


@pytest.mark.parametrize("site", sorted(EMITTING))
async def test_every_record_the_scripts_emit_has_exactly_its_typed_fields(
    h: Harness, site: str
) -> None:
    """Each emit({...}) site against the codec's TypedDict of its record type: a field
    renamed, added or dropped in Lua fails here rather than in the write-behind."""
    run, kinds = EMITTING[site]
    await run(h)
    records = await h.records()
    assert [fields["type"] for fields in records] == kinds
    for fields in records:
        record = packet_records.parse_packet_record(fields)
        required, optional = record_keys(packet_records.PACKET_RECORDS[fields["type"]])
        assert set(fields) == set(record) == required | optional, fields
