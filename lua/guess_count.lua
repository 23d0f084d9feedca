#!lua flags=allow-oom
-- guess_count: count failed authentications of one client address in a fixed window, or
-- read the count (SPEC §3, key guessing). One key per address: a cluster needs no tag.
-- allow-oom: a counter of a few bytes must keep counting while Redis refuses other writes.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.GUESS_COUNT).
local counter = KEYS[1]
local add = ARGV[1]
local window_ms = ARGV[2]
-- Returns {failures, ms_left}: the failures counted in the address's window, and the ms
-- until the window ends (0 when there is none).
local count
if tonumber(add) > 0 then
  count = redis.call('INCRBY', counter, add)
  -- The window starts at the first failure; a counter without a TTL (never expected) gets one.
  if count == tonumber(add) or redis.call('PTTL', counter) < 0 then
    redis.call('PEXPIRE', counter, window_ms)
  end
else
  count = tonumber(redis.call('GET', counter) or 0)
end
local left = redis.call('PTTL', counter)
if left < 0 then
  left = 0
end
return {count, left}
