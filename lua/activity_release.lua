#!lua flags=allow-oom
-- activity_release: drop an activity's Redis copy once no team of it is live (SQL keeps it).
-- KEYS[1] activity hash  KEYS[2] lock index  KEYS[3] deadline index
-- KEYS[4] lock-due index  KEYS[5] deadline-due index (of its slot in Redis Cluster; it leaves both)
-- ARGV[1] activity_id
-- Returns {1} released, {0} a team is still open (nothing changed).
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1 then
  return {0}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return {1}
