#!lua flags=allow-oom
-- lease_hold: take a free lease, or extend the one this holder already has.
-- KEYS[1] lease key (value: the holder's token)
-- ARGV[1] token  ARGV[2] ttl_ms
-- Returns {1} held (taken or extended), {0} another holder has it.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
if holder then
  return {0}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
