#!lua
-- packet_create: put a sent packet and its pre-drawn shares in Redis, idempotently.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.send.PACKET_CREATE); the first ones
-- are named in _packet_lib.
local sender_id = ARGV[3]
local amount_cents = ARGV[4]
local count = ARGV[5]
local strategy = ARGV[6]
local created_ms = ARGV[7]
local expires_ms = ARGV[8]
local retention_ms = ARGV[9]
local shares_at = 10
-- Returns {OK} created (and listed in the due index at its expiry), {EXISTING} already there
-- (nothing changed).
if redis.call('EXISTS', packet_hash) == 1 then
  return {EXISTING}
end
local expire_at = tonumber(expires_ms) + tonumber(retention_ms)
redis.call('HSET', packet_hash, 'sender_id', sender_id, 'amount', amount_cents, 'count', count,
           'strategy', strategy, 'status', 'active', 'remaining_count', count,
           'remaining_cents', amount_cents, 'created_ms', created_ms, 'expires_ms', expires_ms,
           'expire_at_ms', int(expire_at), 'version', 1)
-- unpack() has a C-stack limit near 8000 values: push the shares in chunks.
for first = shares_at, #ARGV, 1000 do
  redis.call('RPUSH', packet_shares, unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
-- The writers' consumer group exists before the first grab can be recorded.
redis.call('XGROUP', 'CREATE', packet_outbox, 'writers', '0', 'MKSTREAM')
redis.call('ZADD', packet_due, expires_ms, packet_id)
redis.call('PEXPIREAT', packet_hash, expire_at)
redis.call('PEXPIREAT', packet_shares, expire_at)
return {OK}
