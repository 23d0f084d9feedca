#!lua flags=allow-oom
-- packet_unadmit: take back a send packet_admit counted when the send did not happen (SQL
-- refused it: too little money, or the packet id was taken by another send).
-- requires: _common
-- requires: _packet_codes
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.admission.PACKET_UNADMIT).
local sender_day = KEYS[1]
local packet_id = ARGV[1]
-- Returns {OK, 1} taken back, {OK, 0} it was not counted (nothing changed).
local counted = redis.call('HGET', sender_day, packet_id)
if not counted then
  return {OK, 0}
end
local amount = split(counted)[1]
redis.call('HDEL', sender_day, packet_id)
redis.call('HINCRBY', sender_day, '#count', -1)
redis.call('HINCRBY', sender_day, '#amount', -tonumber(amount))
return {OK, 1}
