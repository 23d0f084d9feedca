#!lua flags=allow-oom
-- packet_read: a packet's state and grabs after the lazy expiry check.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.read.PACKET_READ), named in
-- _packet_lib.
-- Returns {OK, packet hash as flat list, grabs hash as flat list, now_ms}, or {PACKET_NOT_FOUND}.
local now = now_ms(shift_ms)
if not load_packet(now) then
  return {PACKET_NOT_FOUND}
end
return {OK, redis.call('HGETALL', packet_hash), redis.call('HGETALL', packet_grabs), int(now)}
