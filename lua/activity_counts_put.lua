#!lua
-- activity_counts_put: set an activity's counts from SQL's, once: only while Redis has none
-- (a new activity, or after a loss). The activity's copy is put back before any team of it
-- is, so no script has counted a change SQL's counts miss; live locks are not set here
-- (the lock-expiry zset counts them: none survive a loss).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.ACTIVITY_COUNTS_PUT).
-- requires: _team_codes
local activity_counts = KEYS[1]
local teams_open = ARGV[1]
local teams_formed = ARGV[2]
local teams_failed = ARGV[3]
local members = ARGV[4]
local virtual_completions = ARGV[5]
-- Returns {OK} set, {EXISTING} Redis has counts (nothing changed).
if redis.call('HEXISTS', activity_counts, 'counted') == 1 then
  return {EXISTING}
end
redis.call('HSET', activity_counts, 'counted', 1, 'teams_open', teams_open,
           'teams_formed', teams_formed, 'teams_failed', teams_failed, 'members', members,
           'virtual_completions', virtual_completions)
return {OK}
