#!lua flags=allow-oom
-- lease_release: give a lease back, only if this holder still has it.
-- KEYS[1] lease key
-- ARGV[1] token
-- Returns {1} released, {0} it was not ours (expired, or taken by another).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}
