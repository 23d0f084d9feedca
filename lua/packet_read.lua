#!lua flags=allow-oom
-- packet_read: a packet's state and grabs after the lazy expiry check.
-- requires: _common
-- requires: _packet_lib
-- KEYS[1..6] as _packet_lib
-- ARGV[1..2] as _packet_lib
-- Returns {OK, packet hash as flat list, grabs hash as flat list, now_ms}, or {NOT_FOUND}.
local now = now_ms(ARGV[2])
if not load_packet(now) then
  return {NOT_FOUND}
end
return {OK, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[3]), int(now)}
