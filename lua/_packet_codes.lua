-- _packet_codes: the reply codes of the packet_* scripts.
-- Code numbers, mirrored by groupbuy.redpacket.codes.PacketCode.
-- A refusal's name is its HTTP problem code, upper-cased (PACKET_NOT_FOUND: packet_not_found).
local OK, EXISTING, PACKET_NOT_FOUND, ALREADY_GRABBED, SOLD_OUT, EXPIRED = 0, 1, 2, 3, 4, 5
local NOT_DUE, USER_BLOCKED, LIMIT_EXCEEDED = 6, 7, 8
local NOT_A_RECIPIENT, WRONG_PASSWORD, PASSWORD_LOCKED, SENDER_CANNOT_GRAB = 9, 10, 11, 12
local WITHDRAWN, PACKET_ENDED, NOT_THE_SENDER = 13, 14, 15
