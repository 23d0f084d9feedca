-- outbox_ack: forget outbox entries that are now recorded in SQL.
-- KEYS[1] outbox stream
-- ARGV[1] consumer group that read the entries, or '' when read without one
-- ARGV[2] '1': delete the stream once it is empty (no record can follow), '0': keep it
-- ARGV[3..] entry ids
-- Returns {entries deleted, entries left}.
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
if ARGV[1] ~= '' then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
end
local deleted = redis.call('XDEL', KEYS[1], unpack(ids))
local left = redis.call('XLEN', KEYS[1])
if left == 0 and ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
end
return {deleted, left}
