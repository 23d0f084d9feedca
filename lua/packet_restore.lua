#!lua
-- packet_restore: rebuild a live packet that Redis has lost, from its SQL record, once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- requires: _packet_terms
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.recovery.PACKET_RESTORE); the first ones
-- are named in _packet_lib, the packet as SQL records it in _packet_terms. After the named
-- ARGV: grab_count pairs (user_id, "seq|amount|at_ms") in seq order, then the shares still
-- to grab as "amount|seq", in committed order (count - grab_count of them, summing to what is
-- left: each goes with its seq, so a seq a lost grab left free is given again), then the
-- recipients.
local epoch = ARGV[16]
local version = ARGV[17]
local grab_count = ARGV[18]
local grabs_at = 19
-- Returns {OK, status} rebuilt (status active, or sold_out when SQL has every grab), or
-- {EXISTING} Redis has the packet (another caller rebuilt it first; nothing changed).
if redis.call('EXISTS', packet_hash) == 1 then
  return {EXISTING}
end
local now = now_ms(shift_ms)
local grabs = tonumber(grab_count)
local first_share = grabs_at + 2 * grabs
local left = tonumber(count) - grabs
local last_share = first_share + left - 1
local left_cents = 0
for i = first_share, last_share do
  left_cents = left_cents + tonumber(split(ARGV[i])[1])
end
local expire_at = write_terms()
redis.call('HSET', packet_hash, 'remaining_count', int(left), 'remaining_cents', int(left_cents),
           'epoch', epoch, 'seq_gap', -1, 'version', version)
-- unpack() has a C-stack limit near 8000 values: write grabs in chunks.
for first = grabs_at, first_share - 1, 1000 do
  redis.call('HSET', packet_grabs, unpack(ARGV, first, math.min(first + 999, first_share - 1)))
end
-- The order list: the i-th entry the user of seq i ('' for a seq no recorded grab has).
local order = {}
for first = grabs_at, first_share - 1, 2 do
  local seq = tonumber(split(ARGV[first + 1])[1])
  for _ = #order + 1, seq - 1 do
    order[#order + 1] = ''
  end
  order[seq] = ARGV[first]
end
for at = 1, #order, 1000 do
  redis.call('RPUSH', packet_order, unpack(order, at, math.min(at + 999, #order)))
end
if grabs > 0 then
  redis.call('PEXPIREAT', packet_grabs, expire_at)
  redis.call('PEXPIREAT', packet_order, expire_at)
end
push_chunked(packet_shares, first_share, last_share, expire_at)
add_recipients(last_share + 1, expire_at)
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
