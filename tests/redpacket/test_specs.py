"""Reading the packet scripts' replies by their specs: each code's fields by name, a code a
script's spec does not list is a bug (the scripts themselves are run in tests/lua)."""

from __future__ import annotations

import pytest

from groupbuy.redpacket.admission import PACKET_ADMIT, PACKET_UNADMIT
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.grab import PACKET_GRAB
from groupbuy.redpacket.read import PACKET_GRAB_READ, PACKET_READ
from groupbuy.redpacket.recovery import PACKET_RESTORE
from groupbuy.redpacket.send import PACKET_CREATE
from groupbuy.redpacket.sweeps import PACKET_EXPIRE
from groupbuy.redpacket.withdraw import PACKET_WITHDRAW
from groupbuy.storage.specs import Reply, ReplyError


def test_each_shape_names_its_fields() -> None:
    assert PACKET_GRAB.parse([0, 5, 2, 1, 0, 1700]) == Reply(
        PacketCode.OK, amount_cents=5, remaining_count=2, seq=1, epoch=0, grabbed_at_ms=1700
    )
    assert PACKET_GRAB.parse([3, 5]) == Reply(PacketCode.ALREADY_GRABBED, amount_cents=5)
    assert PACKET_GRAB.parse([4]) == Reply(PacketCode.SOLD_OUT)
    assert PACKET_READ.parse([0, ["status", "active"], ["u1", "1|5|9"], 1, -1, 12]) == Reply(
        PacketCode.OK,
        packet={"status": "active"},
        page=["u1", "1|5|9"],
        total=1,
        next_cursor=-1,
        now_ms=12,
    )
    assert PACKET_GRAB.parse([10, 4]) == Reply(PacketCode.WRONG_PASSWORD, attempts_left=4)
    assert PACKET_GRAB_READ.parse([0]) == Reply(PacketCode.OK, grab=[])
    assert PACKET_WITHDRAW.parse([14, "expired"]) == Reply(
        PacketCode.PACKET_ENDED, status="expired"
    )
    assert PACKET_EXPIRE.parse([0, 7]) == Reply(PacketCode.OK, refunded_cents=7)
    assert PACKET_EXPIRE.parse([6, 99]) == Reply(PacketCode.NOT_DUE, expires_ms=99)
    assert PACKET_EXPIRE.parse([1, "sold_out"]) == Reply(PacketCode.EXISTING, status="sold_out")
    assert PACKET_RESTORE.parse([0, "active"]) == Reply(PacketCode.OK, status="active")
    assert PACKET_CREATE.parse([1]) == Reply(PacketCode.EXISTING)
    assert PACKET_ADMIT.parse([0, 1]) == Reply(PacketCode.OK, counted=True)
    over = PACKET_ADMIT.parse([8, "sender_daily_count", "2", "2"])
    assert over == Reply(PacketCode.LIMIT_EXCEEDED, limit="sender_daily_count", current=2, cap=2)
    assert PACKET_UNADMIT.parse([0, 0]) == Reply(PacketCode.OK, taken_back=False)


def test_each_reply_carries_its_code_and_reads_its_fields_by_name() -> None:
    grabbed = PACKET_GRAB.parse([0, 5, 2, 1, 0, 1700])
    assert grabbed.code is PacketCode.OK and grabbed.amount_cents == 5
    assert PACKET_GRAB.parse([3, 5]).code is PacketCode.ALREADY_GRABBED
    assert PACKET_EXPIRE.parse([1, "expired"]).code is PacketCode.EXISTING
    over = PACKET_ADMIT.parse([8, "sender_daily_count", 2, 2])
    assert over.code is PacketCode.LIMIT_EXCEEDED and over.cap == 2
    with pytest.raises(AttributeError, match="no field 'amount_cents'"):
        _ = PACKET_GRAB.parse([4]).amount_cents


def test_a_code_the_spec_does_not_list_is_a_bug() -> None:
    with pytest.raises(ReplyError, match="packet_grab answered"):
        PACKET_GRAB.parse([int(PacketCode.NOT_DUE), 5])
    with pytest.raises(ReplyError, match="packet_create answered"):
        PACKET_CREATE.parse([int(PacketCode.SOLD_OUT)])
    with pytest.raises(ValueError):  # no such code at all
        PACKET_EXPIRE.parse([99])
    with pytest.raises(ValueError):  # a field short
        PACKET_GRAB.parse([0, 5, 2, 1, 0])
