#!lua flags=allow-oom
-- activity_reindex: set an activity's entry in a due index to the earliest entry of
-- its own index (or remove it when that is empty), after a sweep or by the repair job.
-- KEYS[1] the activity's lock index or deadline index (zset team_id -> ms)
-- KEYS[2] the matching due index (of the activity's slot in Redis Cluster): lock-due or
--         deadline-due (zset activity_id -> ms)
-- ARGV[1] activity_id
-- Returns {1, earliest_ms} indexed, {0} the activity has nothing due any more.
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  redis.call('ZADD', KEYS[2], first[2], ARGV[1])
  return {1, tonumber(first[2])}
end
redis.call('ZREM', KEYS[2], ARGV[1])
return {0}
