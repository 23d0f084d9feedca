"""The packet scripts' code -> error table: each refusal its error, anything else a bug."""

from __future__ import annotations

import pytest

from groupbuy import errors
from groupbuy.locks.codes import TeamCode
from groupbuy.redpacket.codes import PacketCode, raise_for


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (PacketCode.PACKET_NOT_FOUND, errors.PacketNotFound),
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


@pytest.mark.parametrize("code", [*PacketCode, *TeamCode], ids=lambda code: code.name)
def test_a_refusal_has_one_name_from_lua_to_the_problem(code: PacketCode | TeamCode) -> None:
    """A code either raises the error whose problem code is its own name, lower-cased, or
    is an outcome no error stands for (a bug to raise for)."""
    try:
        raise_for(code)
    except errors.GroupBuyError as raised:
        assert raised.code == code.name.lower()
    except RuntimeError as bug:
        assert "no error mapping" in str(bug)
        assert code.name.lower() not in {error.code for error in errors.every_error()}
