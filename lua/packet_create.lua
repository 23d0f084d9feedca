#!lua
-- packet_create: put a sent packet and its pre-drawn shares in Redis, idempotently.
-- requires: _common
-- requires: _packet_lib
-- KEYS[1..6] as _packet_lib
-- ARGV[1..2] as _packet_lib  ARGV[3] sender_id  ARGV[4] amount_cents  ARGV[5] count
-- ARGV[6] strategy  ARGV[7] created_ms  ARGV[8] expires_ms  ARGV[9] retention_ms
-- ARGV[10..] the shares in grab order (count of them, summing to amount)
-- Returns {OK} created (and listed in the due index at its expiry), {EXISTING} already there
-- (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {EXISTING}
end
local expire_at = tonumber(ARGV[8]) + tonumber(ARGV[9])
redis.call('HSET', KEYS[1], 'sender_id', ARGV[3], 'amount', ARGV[4], 'count', ARGV[5],
           'strategy', ARGV[6], 'status', 'active', 'remaining_count', ARGV[5],
           'remaining_cents', ARGV[4], 'created_ms', ARGV[7], 'expires_ms', ARGV[8],
           'expire_at_ms', int(expire_at), 'version', 1)
-- unpack() has a C-stack limit near 8000 values: push the shares in chunks.
for first = 10, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
-- The writers' consumer group exists before the first grab can be recorded.
redis.call('XGROUP', 'CREATE', KEYS[4], 'writers', '0', 'MKSTREAM')
redis.call('ZADD', KEYS[6], ARGV[8], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], expire_at)
redis.call('PEXPIREAT', KEYS[2], expire_at)
return {OK}
