#!lua flags=allow-oom
-- packet_grab_read: one user's grab of a packet.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.read.PACKET_GRAB_READ); the first ones
-- are named in _packet_lib.
local user_id = ARGV[3]
-- Returns {OK, grab value} or {OK} (no grab), {PACKET_NOT_FOUND}.
if redis.call('EXISTS', packet_hash) == 0 then
  return {PACKET_NOT_FOUND}
end
local value = redis.call('HGET', packet_grabs, user_id)
if value then
  return {OK, value}
end
return {OK}
