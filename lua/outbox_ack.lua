#!lua flags=allow-oom
-- outbox_ack: forget outbox entries that are now recorded in SQL, and keep the stream's
-- entry in the pending index true: listed, scored by its oldest entry, while anything is
-- left; gone once it is empty. No entry ids only re-indexes the stream (the repair job).
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.OUTBOX_ACK).
local stream = KEYS[1]
local pending = KEYS[2]
local group = ARGV[1]
local drop_empty = ARGV[2]
local member = ARGV[3]
local ids_at = 4
-- Returns {entries deleted, entries left}.
local deleted = 0
if #ARGV >= ids_at then
  local ids = {}
  for i = ids_at, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
  if group ~= '' then
    redis.call('XACK', stream, group, unpack(ids))
  end
  deleted = redis.call('XDEL', stream, unpack(ids))
end
local left = redis.call('XLEN', stream)
if left == 0 then
  redis.call('ZREM', pending, member)
  if drop_empty == '1' then
    redis.call('DEL', stream)
  end
else
  local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  redis.call('ZADD', pending, string.match(oldest[1][1], '^%d+'), member)
end
return {deleted, left}
