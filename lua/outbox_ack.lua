#!lua flags=allow-oom
-- outbox_ack: forget outbox entries that are now recorded in SQL, and keep the stream's
-- entry in the pending index true: listed, scored by its oldest entry, while anything is
-- left; gone once it is empty.
-- KEYS[1] outbox stream  KEYS[2] pending index (zset member -> ms of the oldest entry)
-- ARGV[1] consumer group that read the entries, or '' when read without one
-- ARGV[2] '1': delete the stream once it is empty (no record can follow), '0': keep it
-- ARGV[3] the stream's member in the pending index (activity_id or packet_id)
-- ARGV[4..] entry ids; none only re-indexes the stream (what the repair job does)
-- Returns {entries deleted, entries left}.
local deleted = 0
if #ARGV >= 4 then
  local ids = {}
  for i = 4, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
  if ARGV[1] ~= '' then
    redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  end
  deleted = redis.call('XDEL', KEYS[1], unpack(ids))
end
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('ZREM', KEYS[2], ARGV[3])
  if ARGV[2] == '1' then
    redis.call('DEL', KEYS[1])
  end
else
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  redis.call('ZADD', KEYS[2], string.match(oldest[1][1], '^%d+'), ARGV[3])
end
return {deleted, left}
