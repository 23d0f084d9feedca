-- packet_expire: close a packet whose time is up and record its refund, exactly once.
-- requires: _common
-- requires: _packet_lib
-- KEYS[1..4] as _packet_lib
-- ARGV[1..2] as _packet_lib
-- Returns {OK, refunded_cents} this call closed it, {NOT_DUE, expires_ms} still active,
-- {EXISTING, status} it had already ended (sold_out or expired), {NOT_FOUND}.
local p = load_packet(now_ms(ARGV[2]))
if not p then
  return {NOT_FOUND}
end
if p.just_expired then
  return {OK, p.remaining_cents}
end
if p.status == 'active' then
  return {NOT_DUE, int(p.expires_ms)}
end
return {EXISTING, p.status}
