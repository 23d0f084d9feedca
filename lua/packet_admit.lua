#!lua
-- packet_admit: let a send past the sender's checks before any money moves.
-- The first step of a send: RedPacketService.send debits the sender in SQL only after OK, so a
-- refused send leaves nothing behind; packet_create puts the packet in Redis afterwards.
-- requires: _common
-- requires: _packet_codes
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.admission.PACKET_ADMIT).
local blocklist = KEYS[1]
local sender_day = KEYS[2]
local sender_id = ARGV[1]
local packet_id = ARGV[2]
local amount_cents = ARGV[3]
local daily_count_cap = ARGV[4]
local daily_amount_cap = ARGV[5]
local day_expire_at_ms = ARGV[6]
local request_token = ARGV[7]
-- Returns {OK, 1} counted by this request (packet_unadmit takes it back if the send does not
-- happen; a resend of the same call finds its token and answers this again),
-- {OK, 0} nothing counted (no cap is set, or another request counted this packet id),
-- {USER_BLOCKED} an admin blocked the sender,
-- {LIMIT_EXCEEDED, cap name, current, cap} the send would pass that cap (current: what the
-- sender sent today, in the cap's unit).
if redis.call('HEXISTS', blocklist, sender_id) == 1 then
  return {USER_BLOCKED}
end
local max_count, max_amount = tonumber(daily_count_cap), tonumber(daily_amount_cap)
if max_count == 0 and max_amount == 0 then
  return {OK, 0}
end
local counted = redis.call('HGET', sender_day, packet_id)
if counted then
  return {OK, split(counted)[2] == request_token and 1 or 0}
end
local totals = redis.call('HMGET', sender_day, '#count', '#amount')
local count, amount = tonumber(totals[1] or '0'), tonumber(totals[2] or '0')
local add = tonumber(amount_cents)
if max_amount > 0 and amount + add > max_amount then
  return {LIMIT_EXCEEDED, 'sender_daily_amount_cents', int(amount), int(max_amount)}
end
if max_count > 0 and count + 1 > max_count then
  return {LIMIT_EXCEEDED, 'sender_daily_count', int(count), int(max_count)}
end
redis.call('HSET', sender_day, packet_id, amount_cents .. '|' .. request_token)
redis.call('HINCRBY', sender_day, '#count', 1)
redis.call('HINCRBY', sender_day, '#amount', add)
redis.call('PEXPIREAT', sender_day, day_expire_at_ms)
return {OK, 1}
