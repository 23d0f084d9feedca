#!lua
-- activity_counts_put: set an activity's counts from SQL's, once: only while Redis has none
-- (a new activity, or after a loss). The activity's copy is put back before any team of it
-- is, so no script has counted a change SQL's counts miss; live locks are not set here
-- (the lock-expiry zset counts them: none survive a loss).
-- Counts put while no team of the activity lives in Redis (a new activity, or a call after
-- activity_release) expire as the activity's copy does (ttl_ms; ActivityCopy.put keeps them
-- as long as the copy): nothing else would delete them. team_open and team_restore take the
-- expiry off, so the counts of a live team stay until activity_release deletes them.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.ACTIVITY_COUNTS_PUT).
-- requires: _team_codes
local activity_counts = KEYS[1]
local teams_open = ARGV[1]
local teams_formed = ARGV[2]
local teams_failed = ARGV[3]
local members = ARGV[4]
local virtual_completions = ARGV[5]
local ttl_ms = ARGV[6]
-- Returns {OK} set, {EXISTING} Redis has counts (nothing changed).
if redis.call('HEXISTS', activity_counts, 'counted') == 1 then
  return {EXISTING}
end
-- A hash without `counted` holds what a team script counted before these were put: a team
-- lives, so they do not expire.
local fresh = redis.call('EXISTS', activity_counts) == 0
redis.call('HSET', activity_counts, 'counted', 1, 'teams_open', teams_open,
           'teams_formed', teams_formed, 'teams_failed', teams_failed, 'members', members,
           'virtual_completions', virtual_completions)
if fresh then
  redis.call('PEXPIRE', activity_counts, ttl_ms)
end
return {OK}
