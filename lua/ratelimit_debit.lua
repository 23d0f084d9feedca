#!lua
-- ratelimit_debit: count requests a process already let through against buckets shared by
-- every process (the GCRA "theoretical arrival time" ratelimit_take keeps), and answer
-- where each bucket stands, so the process decides its next requests from that.
-- The debit is unconditional: a request let through is counted even past the limit, so
-- the bucket refuses the next ones longer and the rate over time stays the quota's.
-- No flags: over maxmemory Redis refuses it before it runs (the requests went through).
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.RATELIMIT_DEBIT): KEYS are the
-- buckets from buckets_at on, one hash tag; ARGV a (quota, window_us, count) triple per
-- bucket from debits_at on; count 0 only reads.
local buckets_at = 1
local shift_ms = ARGV[1]
local debits_at = 2
-- Returns {0, ahead_us_1, ahead_us_2, ...}: per bucket in KEYS order, how far its
-- theoretical arrival time is ahead of now after the debit, in µs (0: the bucket is full).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(shift_ms) * 1000

local reply = {0}
for i = buckets_at, #KEYS do
  local at = debits_at + 3 * (i - 1)
  local quota = tonumber(ARGV[at])
  local window = tonumber(ARGV[at + 1])
  local count = tonumber(ARGV[at + 2])
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0)
  if tat < now then
    tat = now
  end
  if count > 0 then
    tat = tat + count * window / quota
    redis.call('SET', KEYS[i], string.format('%.1f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  end
  reply[#reply + 1] = math.floor(tat - now)
end
return reply
