#!lua flags=allow-oom
-- lease_hold: take a free lease, or extend the one this holder already has.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.LEASE_HOLD).
local lease = KEYS[1]
local token = ARGV[1]
local ttl_ms = ARGV[2]
-- Returns {1} held (taken or extended), {0} another holder has it.
local holder = redis.call('GET', lease)
if holder == token then
  redis.call('PEXPIRE', lease, ttl_ms)
  return {1}
end
if holder then
  return {0}
end
redis.call('SET', lease, token, 'PX', ttl_ms)
return {1}
