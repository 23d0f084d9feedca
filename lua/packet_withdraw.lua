#!lua
-- packet_withdraw: the sender takes back what is left of an active packet, exactly once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.withdraw.PACKET_WITHDRAW); the first
-- ones are named in _packet_lib.
local sender_id = ARGV[3]
-- Returns {OK, refunded_cents} withdrawn now (the refund recorded as an expiry's is),
-- {EXISTING, refunded_cents} withdrawn before (nothing changed), {NOT_THE_SENDER},
-- {PACKET_ENDED, status} sold out or expired, {PACKET_NOT_FOUND}.
local now = now_ms(shift_ms)
local p = load_packet(now)
if not p then
  return {PACKET_NOT_FOUND}
end
if p.sender_id ~= sender_id then
  return {NOT_THE_SENDER}
end
if p.status == 'withdrawn' then
  return {EXISTING, tonumber(redis.call('HGET', packet_hash, 'refunded'))}
end
if p.status ~= 'active' then
  return {PACKET_ENDED, p.status}
end
end_with_refund(p, 'withdrawn', now)
return {OK, p.remaining_cents}
