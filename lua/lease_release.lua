#!lua flags=allow-oom
-- lease_release: give a lease back, only if this holder still has it.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.LEASE_RELEASE).
local lease = KEYS[1]
local token = ARGV[1]
-- Returns {1} released, {0} it was not ours (expired, or taken by another).
if redis.call('GET', lease) == token then
  redis.call('DEL', lease)
  return {1}
end
return {0}
