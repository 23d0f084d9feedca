#!lua
-- packet_admit: let a send past the sender's checks before any money moves.
-- The first step of a send: RedPacketService.send debits the sender in SQL only after OK, so a
-- refused send leaves nothing behind; packet_create puts the packet in Redis afterwards.
-- requires: _common
-- requires: _packet_lib
-- (_packet_lib for its code numbers only: this script has KEYS of its own.)
-- KEYS[1] blocked users hash (user_id -> when, and why; in Redis Cluster the copy of the
--         sender's slot, see Keys.blocked_users)
-- KEYS[2] the sender's hash for this UTC day (Keys.sender_day: packet_id ->
--         "amount_cents|request token" of each send counted, and the totals under '#count'
--         and '#amount')
-- ARGV[1] sender_id  ARGV[2] packet_id  ARGV[3] amount_cents
-- ARGV[4] sender_daily_count  ARGV[5] sender_daily_amount_cents (0: no such cap)
-- ARGV[6] when the day's hash expires (ms, a little after the day ends)
-- ARGV[7] request token (fresh for each send request)
-- Returns {OK, 1} counted by this request (packet_unadmit takes it back if the send does not
-- happen; a resend of the same call finds its token and answers this again),
-- {OK, 0} nothing counted (no cap is set, or another request counted this packet id),
-- {USER_BLOCKED} an admin blocked the sender,
-- {LIMIT_EXCEEDED, cap name, current, cap} the send would pass that cap (current: what the
-- sender sent today, in the cap's unit).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {USER_BLOCKED}
end
local max_count, max_amount = tonumber(ARGV[4]), tonumber(ARGV[5])
if max_count == 0 and max_amount == 0 then
  return {OK, 0}
end
local counted = redis.call('HGET', KEYS[2], ARGV[2])
if counted then
  return {OK, split(counted)[2] == ARGV[7] and 1 or 0}
end
local totals = redis.call('HMGET', KEYS[2], '#count', '#amount')
local count, amount = tonumber(totals[1] or '0'), tonumber(totals[2] or '0')
local add = tonumber(ARGV[3])
if max_amount > 0 and amount + add > max_amount then
  return {LIMIT_EXCEEDED, 'sender_daily_amount_cents', int(amount), int(max_amount)}
end
if max_count > 0 and count + 1 > max_count then
  return {LIMIT_EXCEEDED, 'sender_daily_count', int(count), int(max_count)}
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. '|' .. ARGV[7])
redis.call('HINCRBY', KEYS[2], '#count', 1)
redis.call('HINCRBY', KEYS[2], '#amount', add)
redis.call('PEXPIREAT', KEYS[2], ARGV[6])
return {OK, 1}
