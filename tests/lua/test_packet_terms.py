"""The terms a sender puts on a packet, in its scripts: recipients, password, the sender's
own grab, withdrawal, and reads that page through the grab order; each refusal is
decided before the grab's first write."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.redpacket.codec import share_value
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.read import PACKET_GRAB_READ, packet_read
from groupbuy.redpacket.recovery import packet_restore
from groupbuy.redpacket.sweeps import packet_expire
from groupbuy.redpacket.terms import password_hash
from groupbuy.redpacket.withdraw import packet_withdraw
from groupbuy.storage.specs import Reply
from tests.support.packet_scripts import PID, Harness, plain_terms

SALT = "00" * 16


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    return harness


async def untouched(h: Harness, shares: int) -> None:
    """Nothing was grabbed: the shares are all there, no record, no grab."""
    assert await h.redis.llen(h.keys.shares) == shares
    assert await h.records() == []
    assert not await h.redis.exists(h.keys.grabs, h.keys.order)


async def test_only_recipients_grab(h: Harness) -> None:
    await h.create([2, 1], recipients=["ann", "bob", "cy"])
    assert await h.grab("eve") == Reply(PacketCode.NOT_A_RECIPIENT)
    await untouched(h, 2)
    assert (await h.grab("bob")).code is PacketCode.OK
    assert await h.redis.pttl(h.keys.recipients) > 0  # goes with the packet


async def test_the_sender_may_be_kept_out(h: Harness) -> None:
    await h.create([2, 1], gate="s")
    assert await h.grab("sender") == Reply(PacketCode.SENDER_CANNOT_GRAB)
    await untouched(h, 2)
    assert (await h.grab("other")).code is PacketCode.OK


async def test_a_wrong_password_is_counted_and_five_lock_the_user_out(h: Harness) -> None:
    right = password_hash(SALT, "open sesame")
    await h.create([2, 1], gate="p", pw_salt=SALT, pw_hash=right)
    assert await h.grab("ann") == Reply(PacketCode.WRONG_PASSWORD, attempts_left=5)  # none given
    for left in (4, 3, 2, 1, 0):
        wrong = await h.grab("ann", digest=password_hash(SALT, "guess"))
        assert wrong == Reply(PacketCode.WRONG_PASSWORD, attempts_left=left)
    assert await h.grab("ann", digest=right) == Reply(PacketCode.PASSWORD_LOCKED)
    await untouched(h, 2)
    assert await h.redis.pttl(h.keys.attempts) > 0
    assert (await h.grab("bob", digest=right)).code is PacketCode.OK


async def test_withdraw_ends_the_packet_once(h: Harness) -> None:
    await h.create([5, 3, 2])
    await h.grab("u1")
    assert await packet_withdraw(h.packets, PID, "other") == Reply(PacketCode.NOT_THE_SENDER)
    assert await packet_withdraw(h.packets, PID, "sender") == Reply(PacketCode.OK, refunded_cents=5)
    again = await packet_withdraw(h.packets, PID, "sender")
    assert again == Reply(PacketCode.EXISTING, refunded_cents=5)
    assert await h.grab("u2") == Reply(PacketCode.WITHDRAWN)
    assert await h.grab("u1") == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    h.shift_ms += 120_000
    assert await packet_expire(h.packets, PID) == Reply(PacketCode.EXISTING, status="withdrawn")
    records = await h.records()
    assert [r["type"] for r in records] == ["grab", "packet.withdrawn", "packet.refunded"]
    assert (records[2]["reason"], records[2]["refunded_cents"]) == ("withdrawn", "5")
    assert [r["version"] for r in records[1:]] == ["3", "4"]
    assert await h.redis.zscore(h.keys.due, PID) is None
    assert not await h.redis.exists(h.keys.shares)


async def test_an_ended_packet_cannot_be_withdrawn(h: Harness) -> None:
    await h.create([1])
    await h.grab("u1")
    ended = await packet_withdraw(h.packets, PID, "sender")
    assert ended == Reply(PacketCode.PACKET_ENDED, status="sold_out")
    assert await packet_withdraw(h.packets, "nope", "sender") == Reply(PacketCode.PACKET_NOT_FOUND)


async def test_reads_page_through_the_grab_order(h: Harness) -> None:
    await h.create([1] * 5)
    for user in ("e", "d", "c", "b", "a"):
        await h.grab(user)
    page = await packet_read(h.packets, PID, cursor=1, limit=2)
    assert page.page[0::2] == ["d", "c"] and page.total == 5 and page.next_cursor == 3
    assert (await packet_read(h.packets, PID, cursor=4, limit=2)).page[0::2] == ["a"]
    assert (await packet_read(h.packets, PID, cursor=5, limit=2)).page == []
    one = await h.packets.run(PACKET_GRAB_READ, PID, user_id="c")
    assert one.code is PacketCode.OK and one.grab[0].startswith("3|1|")
    assert (await h.packets.run(PACKET_GRAB_READ, PID, user_id="zz")).grab == []


async def test_a_packet_from_before_the_order_list_is_read_in_seq_order(h: Harness) -> None:
    await h.create([1] * 3)
    for user in ("z", "y", "x"):
        await h.grab(user)
    await h.redis.delete(h.keys.order)  # as a packet grabbed before the list existed
    page = await packet_read(h.packets, PID, cursor=1, limit=5)
    assert page.page[0::2] == ["y", "x"] and page.total == 3


def test_plain_terms_have_no_gate() -> None:
    assert plain_terms()["gate"] == "" and plain_terms(3)["gate"] == "r"


async def test_a_rebuild_gives_a_lost_grab_s_seq_and_share_to_the_next_grab(h: Harness) -> None:
    # SQL has seq 1 and 3; seq 2 was answered but lost with Redis. Its share comes back with
    # its seq, so grabs in seq order stay the committed shares: 4, 3, 2, 1.
    now = await h.now_ms()
    recorded = ["u1", "1|4|1000", "u3", "3|2|1002"]
    queued = [share_value(2, 3), share_value(4, 1)]
    rebuilt = await packet_restore(
        h.packets,
        PID,
        [*recorded, *queued],
        sender_id="sender",
        amount_cents=10,
        count=4,
        strategy="double_mean",
        created_ms=now,
        expires_ms=now + 60_000,
        retention_ms=3_600_000,
        **plain_terms(),
        epoch=1,
        version=100,
        grab_count=2,
    )
    assert rebuilt == Reply(PacketCode.OK, status="active")
    first, second = await h.grab("n1"), await h.grab("n2")
    assert (first.seq, first.amount_cents, second.seq, second.amount_cents) == (2, 3, 4, 1)
    page = await packet_read(h.packets, PID, cursor=0, limit=10)
    assert page.page[0::2] == ["u1", "n1", "u3", "n2"] and page.next_cursor == -1
    assert [v.split("|")[1] for v in page.page[1::2]] == ["4", "3", "2", "1"]
