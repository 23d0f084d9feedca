-- outbox_ack: forget outbox entries that are now recorded in SQL; drop the stream once empty.
-- KEYS[1] outbox stream
-- ARGV entry ids
-- Returns {entries deleted, entries left}.
local deleted = redis.call('XDEL', KEYS[1], unpack(ARGV))
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('DEL', KEYS[1])
end
return {deleted, left}
