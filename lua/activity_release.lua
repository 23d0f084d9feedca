#!lua flags=allow-oom
-- activity_release: drop an activity's Redis copy and counts once no team of it is live and
-- SQL has every record of it (SQL keeps it; the counts come back from SQL when next read).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.ACTIVITY_RELEASE).
local activity_hash = KEYS[1]
local activity_lock_index = KEYS[2]
local activity_deadlines = KEYS[3]
local activity_due_locks = KEYS[4]
local activity_due_deadlines = KEYS[5]
local activity_outbox = KEYS[6]
local activity_counts = KEYS[7]
local activity_lock_expiries = KEYS[8]
local activity_waitlist = KEYS[9]
local activity_id = ARGV[1]
-- Returns {1} released, {0} a team is still open or a record waits for SQL (nothing changed).
if redis.call('EXISTS', activity_lock_index) == 1 or redis.call('EXISTS', activity_deadlines) == 1
   or redis.call('EXISTS', activity_outbox) == 1 or redis.call('EXISTS', activity_waitlist) == 1 then
  return {0}
end
redis.call('DEL', activity_hash, activity_counts, activity_lock_expiries)
redis.call('ZREM', activity_due_locks, activity_id)
redis.call('ZREM', activity_due_deadlines, activity_id)
return {1}
