#!lua
-- packet_restore: rebuild a live packet that Redis has lost, from its SQL record, once.
-- requires: _common
-- requires: _packet_lib
-- KEYS[1..6] as _packet_lib
-- ARGV[1..2] as _packet_lib  ARGV[3] sender_id  ARGV[4] amount_cents  ARGV[5] count
-- ARGV[6] strategy  ARGV[7] created_ms  ARGV[8] expires_ms  ARGV[9] retention_ms
-- ARGV[10] epoch (SQL's, already raised: records of the lost epoch are fenced out there)
-- ARGV[11] seq_gap (the highest recorded seq minus the number of recorded grabs)
-- ARGV[12] version: above every version the lost state can have had (see RedPacketService.restore)
-- ARGV[13] g, the number of recorded grabs, then g pairs (user_id, "seq|amount|at_ms")
-- then the shares still to grab, in grab order (count - g of them, summing to what is left)
-- Returns {OK, status} rebuilt (status active, or sold_out when SQL has every grab), or
-- {EXISTING} Redis has the packet (another caller rebuilt it first; nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {EXISTING}
end
local now = now_ms(ARGV[2])
local grabs = tonumber(ARGV[13])
local first_share = 14 + 2 * grabs
local left = #ARGV - first_share + 1
local left_cents = 0
for i = first_share, #ARGV do
  left_cents = left_cents + tonumber(ARGV[i])
end
local expire_at = tonumber(ARGV[8]) + tonumber(ARGV[9])
redis.call('HSET', KEYS[1], 'sender_id', ARGV[3], 'amount', ARGV[4], 'count', ARGV[5],
           'strategy', ARGV[6], 'status', 'active', 'remaining_count', int(left),
           'remaining_cents', int(left_cents), 'created_ms', ARGV[7], 'expires_ms', ARGV[8],
           'expire_at_ms', int(expire_at), 'epoch', ARGV[10], 'seq_gap', ARGV[11],
           'version', ARGV[12])
redis.call('PEXPIREAT', KEYS[1], expire_at)
-- unpack() has a C-stack limit near 8000 values: write grabs and shares in chunks.
for first = 14, first_share - 1, 1000 do
  redis.call('HSET', KEYS[3], unpack(ARGV, first, math.min(first + 999, first_share - 1)))
end
if grabs > 0 then
  redis.call('PEXPIREAT', KEYS[3], expire_at)
end
for first = first_share, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if left > 0 then
  redis.call('PEXPIREAT', KEYS[2], expire_at)
end
-- The stream may survive a partial loss; its group must exist before the next record.
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[4], 'writers', '0', 'MKSTREAM')
end
if left == 0 then
  -- Every share is recorded in SQL but the ending was lost: record it again.
  redis.call('HSET', KEYS[1], 'status', 'sold_out', 'sold_out_ms', int(now))
  emit({'type', 'packet.sold_out', 'at_ms', int(now), 'packet_id', ARGV[1],
        'sender_id', ARGV[3], 'epoch', ARGV[10],
        'version', redis.call('HINCRBY', KEYS[1], 'version', 1)})
  return {OK, 'sold_out'}
end
redis.call('ZADD', KEYS[6], ARGV[8], ARGV[1])
return {OK, 'active'}
