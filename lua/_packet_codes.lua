-- _packet_codes: the reply codes of the packet_* scripts.
-- Code numbers, mirrored by groupbuy.redpacket.codes.PacketCode.
local OK, EXISTING, NOT_FOUND, ALREADY_GRABBED, SOLD_OUT, EXPIRED, NOT_DUE = 0, 1, 2, 3, 4, 5, 6
local USER_BLOCKED, LIMIT_EXCEEDED = 7, 8
