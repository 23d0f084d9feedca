#!lua
-- ratelimit_take: take one request from every bucket given (an API key's, a user's), or from
-- none of them, atomically (GCRA: a token bucket kept as one "theoretical arrival time").
-- No flags: over maxmemory Redis refuses it before it runs, and the service then lets the
-- request through unlimited (reads go on answering; a write is refused by its own script).
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.RATELIMIT_TAKE): KEYS are the
-- buckets from buckets_at on, ARGV a (quota, window_us) pair per bucket from limits_at on.
local buckets_at = 1
local shift_ms = ARGV[1]
local limits_at = 2
-- Returns {code, remaining_1, reset_s_1, wait_us_1, remaining_2, ...}, per bucket in KEYS
-- order: code 0 TAKEN (from every bucket), 1 LIMITED (from none: a request the user's
-- bucket refuses costs the key's bucket nothing); remaining: requests that could follow at
-- once; reset_s: whole seconds until the bucket is full again; wait_us: how long until this
-- bucket would take one more (0: it would now).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(shift_ms) * 1000

local limited = false
local tats, replies = {}, {}
for i = buckets_at, #KEYS do
  local quota = tonumber(ARGV[limits_at + 2 * (i - 1)])
  local window = tonumber(ARGV[limits_at + 2 * (i - 1) + 1])
  local interval = window / quota
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0)
  if tat < now then
    tat = now
  end
  local next_tat = tat + interval
  -- one more fits when the bucket, after it, holds at most `window` of debt
  local wait = next_tat - window - now
  if wait > 0 then
    limited = true
    replies[i] = {0, math.ceil((tat - now) / 1000000), math.ceil(wait)}
  else
    tats[i] = next_tat
    replies[i] = {math.floor((window - (next_tat - now)) / interval + 1e-9),
                  math.ceil((next_tat - now) / 1000000), 0, tat}
  end
end

local reply = {limited and 1 or 0}
for i = buckets_at, #KEYS do
  if not limited then
    redis.call('SET', KEYS[i], string.format('%.1f', tats[i]),
               'PX', math.ceil((tats[i] - now) / 1000) + 1)
  elseif replies[i][3] == 0 then
    -- this bucket would have taken it, but nothing is taken: it keeps what it had
    replies[i][1] = replies[i][1] + 1
    replies[i][2] = math.ceil((replies[i][4] - now) / 1000000)
  end
  for j = 1, 3 do
    reply[#reply + 1] = replies[i][j]
  end
end
return reply
