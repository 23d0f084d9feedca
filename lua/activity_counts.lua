#!lua flags=allow-oom
-- activity_counts: an activity's live counts, after time is applied where it is due (a team
-- past its deadline ends, an expired lock goes), so they are exact at the call's instant.
-- The counters are kept by the scripts that change them (_team_lib: tally); live locks are
-- the entries of the lock-expiry zset that expire after now (O(log n)).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.ACTIVITY_COUNTS), named in
-- _pick_keys (the cursor is not read).
-- requires: _common
-- requires: _team_codes
-- requires: _pick_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _team_pick
-- Returns {OK, teams_open, teams_formed, teams_failed, members, live_locks,
-- virtual_completions, now_ms, waiting, waiting_any_team, oldest_entry_expires_ms or ''}
-- (now_ms: Redis's clock, which the activity's status is judged on; the waitlist's entries
-- waiting, those for any team, and when the oldest one expires), {LOOK_FURTHER} more was due than one call applies (call again: each
-- call goes further), {ACTIVITY_NOT_FOUND} Redis has no counts (put them back from SQL).
local now = now_ms(shift_ms)
if apply_time(now, tonumber(candidates)) then
  return {LOOK_FURTHER}
end
local c = redis.call('HMGET', A.counts, 'counted', 'teams_open', 'teams_formed', 'teams_failed',
                     'members', 'virtual_completions')
if not c[1] then
  return {ACTIVITY_NOT_FOUND}
end
local live = redis.call('ZCOUNT', A.lock_expiries, '(' .. int(now), '+inf')
local oldest = redis.call('ZRANGE', A.waitlist_due, 0, 0, 'WITHSCORES')[2]
return {OK, tonumber(c[2] or '0'), tonumber(c[3] or '0'), tonumber(c[4] or '0'),
        tonumber(c[5] or '0'), live, tonumber(c[6] or '0'), int(now),
        tonumber(redis.call('HGET', A.waitlist, '~waiting') or '0'),
        redis.call('ZCARD', A.line), oldest and int(tonumber(oldest)) or ''}
