"""Parsing the packet scripts' replies: each shape's fields by name, a code a script's
contract does not list is a bug (the scripts themselves are run in tests/lua)."""

from __future__ import annotations

import pytest

from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.replies import (
    Admitted,
    AlreadyGrabbed,
    Closed,
    CodeOnly,
    Ended,
    Grabbed,
    NotDue,
    OverCap,
    PacketState,
    Restored,
    Unadmitted,
    admit_reply,
    create_reply,
    expire_reply,
    grab_reply,
    read_reply,
    restore_reply,
    unadmit_reply,
)


def test_each_shape_names_its_fields() -> None:
    assert grab_reply([0, 5, 2, 1, 0, 1700]) == Grabbed(5, 2, 1, 0, 1700)
    assert grab_reply([3, 5]) == AlreadyGrabbed(amount_cents=5)
    assert grab_reply([4]) == CodeOnly(PacketCode.SOLD_OUT)
    assert read_reply([0, ["status", "active"], ["u1", "1|5|9"], 12]) == PacketState(
        {"status": "active"}, {"u1": "1|5|9"}, now_ms=12
    )
    assert expire_reply([0, 7]) == Closed(refunded_cents=7)
    assert expire_reply([6, 99]) == NotDue(expires_ms=99)
    assert expire_reply([1, "sold_out"]) == Ended(status="sold_out")
    assert restore_reply([0, "active"]) == Restored(status="active")
    assert create_reply([1]) == CodeOnly(PacketCode.EXISTING)
    assert admit_reply([0, 1]) == Admitted(counted=True)
    assert admit_reply([8, "sender_daily_count", "2", "2"]) == OverCap("sender_daily_count", 2, 2)
    assert unadmit_reply([0, 0]) == Unadmitted(taken_back=False)


def test_each_shape_carries_its_code() -> None:
    assert Grabbed(5, 2, 1, 0, 1700).code is PacketCode.OK
    assert AlreadyGrabbed(5).code is PacketCode.ALREADY_GRABBED
    assert Ended("expired").code is PacketCode.EXISTING
    assert OverCap("sender_daily_count", 2, 2).code is PacketCode.LIMIT_EXCEEDED


def test_a_code_the_contract_does_not_list_is_a_bug() -> None:
    with pytest.raises(RuntimeError, match="packet_grab answered"):
        grab_reply([int(PacketCode.NOT_DUE), 5])
    with pytest.raises(RuntimeError, match="packet_create answered"):
        create_reply([int(PacketCode.SOLD_OUT)])
    with pytest.raises(ValueError):  # no such code at all
        expire_reply([99])
