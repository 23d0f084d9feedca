#!lua flags=allow-oom
-- activity_reindex: set an activity's entry in a due index to the earliest entry of
-- its own index (or remove it when that is empty), after a sweep or by the repair job.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.ACTIVITY_REINDEX).
local team_index = KEYS[1]
local due_index = KEYS[2]
local also_index = KEYS[3]
local activity_id = ARGV[1]
-- Returns {1, earliest_ms} indexed, {0} the activity has nothing due any more.
local first = redis.call('ZRANGE', team_index, 0, 0, 'WITHSCORES')
if also_index then
  local also = redis.call('ZRANGE', also_index, 0, 0, 'WITHSCORES')
  if also[2] and (not first[2] or tonumber(also[2]) < tonumber(first[2])) then
    first = also
  end
end
if first[2] then
  redis.call('ZADD', due_index, first[2], activity_id)
  return {1, tonumber(first[2])}
end
redis.call('ZREM', due_index, activity_id)
return {0}
