"""The packet scripts' code -> error table: each refusal its error, anything else a bug."""

from __future__ import annotations

import pytest

from groupbuy import errors
from groupbuy.redpacket.codes import PacketCode, raise_for


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (PacketCode.NOT_FOUND, errors.PacketNotFound),
        (PacketCode.SOLD_OUT, errors.SoldOut),
        (PacketCode.EXPIRED, errors.Expired),
        (PacketCode.USER_BLOCKED, errors.UserBlocked),
        (PacketCode.LIMIT_EXCEEDED, errors.LimitExceeded),
    ],
)
def test_each_refusal_raises_its_error(code: PacketCode, error: type[Exception]) -> None:
    with pytest.raises(error, match="packet 'p1'"):
        raise_for(code, "packet 'p1'")


@pytest.mark.parametrize(
    "code", [PacketCode.OK, PacketCode.EXISTING, PacketCode.ALREADY_GRABBED, PacketCode.NOT_DUE]
)
def test_a_code_without_an_error_is_a_bug(code: PacketCode) -> None:
    with pytest.raises(RuntimeError, match="no error mapping"):
        raise_for(code)
