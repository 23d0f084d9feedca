#!lua
-- packet_restore: rebuild a live packet that Redis has lost, from its SQL record, once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.recovery.PACKET_RESTORE); the first ones
-- are named in _packet_lib. After the named ARGV: grab_count pairs (user_id,
-- "seq|amount|at_ms"), then the shares still to grab, in grab order (count - grab_count of
-- them, summing to what is left).
local sender_id = ARGV[3]
local amount_cents = ARGV[4]
local count = ARGV[5]
local strategy = ARGV[6]
local created_ms = ARGV[7]
local expires_ms = ARGV[8]
local retention_ms = ARGV[9]
local epoch = ARGV[10]
local seq_gap = ARGV[11]
local version = ARGV[12]
local grab_count = ARGV[13]
local grabs_at = 14
-- Returns {OK, status} rebuilt (status active, or sold_out when SQL has every grab), or
-- {EXISTING} Redis has the packet (another caller rebuilt it first; nothing changed).
if redis.call('EXISTS', packet_hash) == 1 then
  return {EXISTING}
end
local now = now_ms(shift_ms)
local grabs = tonumber(grab_count)
local first_share = grabs_at + 2 * grabs
local left = #ARGV - first_share + 1
local left_cents = 0
for i = first_share, #ARGV do
  left_cents = left_cents + tonumber(ARGV[i])
end
local expire_at = tonumber(expires_ms) + tonumber(retention_ms)
redis.call('HSET', packet_hash, 'sender_id', sender_id, 'amount', amount_cents, 'count', count,
           'strategy', strategy, 'status', 'active', 'remaining_count', int(left),
           'remaining_cents', int(left_cents), 'created_ms', created_ms, 'expires_ms', expires_ms,
           'expire_at_ms', int(expire_at), 'epoch', epoch, 'seq_gap', seq_gap,
           'version', version)
redis.call('PEXPIREAT', packet_hash, expire_at)
-- unpack() has a C-stack limit near 8000 values: write grabs and shares in chunks.
for first = grabs_at, first_share - 1, 1000 do
  redis.call('HSET', packet_grabs, unpack(ARGV, first, math.min(first + 999, first_share - 1)))
end
if grabs > 0 then
  redis.call('PEXPIREAT', packet_grabs, expire_at)
end
for first = first_share, #ARGV, 1000 do
  redis.call('RPUSH', packet_shares, unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if left > 0 then
  redis.call('PEXPIREAT', packet_shares, expire_at)
end
-- The stream may survive a partial loss; its group must exist before the next record.
if redis.call('EXISTS', packet_outbox) == 0 then
  redis.call('XGROUP', 'CREATE', packet_outbox, 'writers', '0', 'MKSTREAM')
end
if left == 0 then
  -- Every share is recorded in SQL but the ending was lost: record it again.
  redis.call('HSET', packet_hash, 'status', 'sold_out', 'sold_out_ms', int(now))
  emit({'type', 'packet.sold_out', 'at_ms', int(now), 'packet_id', packet_id,
        'sender_id', sender_id, 'epoch', epoch,
        'version', redis.call('HINCRBY', packet_hash, 'version', 1)})
  return {OK, 'sold_out'}
end
redis.call('ZADD', packet_due, expires_ms, packet_id)
return {OK, 'active'}
