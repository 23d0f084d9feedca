#!lua flags=allow-oom
-- packet_expire: close a packet whose time is up and record its refund, exactly once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.sweeps.PACKET_EXPIRE), named in
-- _packet_lib.
-- Returns {OK, refunded_cents} this call closed it, {NOT_DUE, expires_ms} still active,
-- {EXISTING, status} it had already ended (sold_out or expired), {PACKET_NOT_FOUND}.
-- Afterwards the due index lists the packet exactly while it is active, at its expiry.
local p = load_packet(now_ms(shift_ms))
if not p then
  redis.call('ZREM', packet_due, packet_id)
  return {PACKET_NOT_FOUND}
end
if p.just_expired then
  return {OK, p.remaining_cents}
end
if p.status == 'active' then
  redis.call('ZADD', packet_due, int(p.expires_ms), packet_id)
  return {NOT_DUE, int(p.expires_ms)}
end
redis.call('ZREM', packet_due, packet_id)
return {EXISTING, p.status}
