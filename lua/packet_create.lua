#!lua
-- packet_create: put a sent packet, its committed shares and its recipients in Redis, once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- requires: _packet_terms
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.send.PACKET_CREATE); the first ones
-- are named in _packet_lib, the packet as SQL records it in _packet_terms.
local shares_at = 16
-- Returns {OK} created (and listed in the due index at its expiry), {EXISTING} already there
-- (nothing changed).
if redis.call('EXISTS', packet_hash) == 1 then
  return {EXISTING}
end
local expire_at = write_terms()
push_chunked(packet_shares, shares_at, shares_at + tonumber(count) - 1, expire_at)
add_recipients(shares_at + tonumber(count), expire_at)
-- The writers' consumer group exists before the first grab can be recorded.
redis.call('XGROUP', 'CREATE', packet_outbox, 'writers', '0', 'MKSTREAM')
redis.call('ZADD', packet_due, expires_ms, packet_id)
return {OK}
