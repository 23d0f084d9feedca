#!lua flags=allow-oom
-- packet_unadmit: take back a send packet_admit counted when the send did not happen (SQL
-- refused it: too little money, or the packet id was taken by another send).
-- requires: _common
-- requires: _packet_lib
-- (_packet_lib for its code numbers only: this script has KEYS of its own.)
-- KEYS[1] the sender's hash for that UTC day, as packet_admit  ARGV[1] packet_id
-- Returns {OK, 1} taken back, {OK, 0} it was not counted (nothing changed).
local counted = redis.call('HGET', KEYS[1], ARGV[1])
if not counted then
  return {OK, 0}
end
local amount = split(counted)[1]
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[1], '#count', -1)
redis.call('HINCRBY', KEYS[1], '#amount', -tonumber(amount))
return {OK, 1}
