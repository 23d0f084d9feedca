#!lua
-- team_extend: the payment is taking longer: a user's live seat lock on a team now expires
-- at locked_at + hold_ms, never later than the team's deadline (Redisson's updateLeaseTime).
-- Every index follows the new expiry ("Extended locks" in _team_lib): the lock's score in
-- the locks zset, the team's entry in the lock index, the activity's lock-expiry zset and
-- the user's current-lock key (value and PX). A hold that would shorten the lock, or a
-- repeat, changes nothing.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.extend.TEAM_EXTEND); the first ones are
-- named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
local user_lock = KEYS[18]
local user_id = ARGV[5]
local hold_ms = ARGV[6]
-- Returns {OK, locked_at_ms, expires_at_ms, version, extended 0|1} the lock after the call
-- (extended: 1 when this call moved its expiry, 0 when it was left as it was),
-- {INVALID_REQUEST, min_hold_ms, max_hold_ms} hold_ms is outside [the activity's lock_ttl,
-- its max_hold_ms (absent: its lock_ttl)], checked first (nothing changed),
-- {LOCK_REQUIRED} the user holds no live lock on this team, {TEAM_NOT_FOUND},
-- {ACTIVITY_NOT_FOUND} Redis has no copy of the activity (put it back from SQL, call again).
local activity = redis.call('HMGET', activity_hash, 'lock_ttl_ms', 'max_hold_ms')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
local hold = tonumber(hold_ms)
local min_hold = tonumber(activity[1])
local max_hold = tonumber(activity[2] or activity[1])
if hold < min_hold or hold > max_hold then
  return {INVALID_REQUEST, int(min_hold), int(max_hold)}
end
local now = now_ms(shift_ms)
local user = user_id
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
local score = redis.call('ZSCORE', team_locks, user)
if not score then
  return {LOCK_REQUIRED}
end
score = tonumber(score)
local locked_at = held_since(team, user, score)
local expires = score + team.lock_ttl_ms
local wanted = math.min(locked_at + hold, team.deadline_ms)
if wanted <= expires then
  return {OK, int(locked_at), int(expires), tonumber(redis.call('HGET', team_hash, 'version')), 0}
end

redis.call('ZADD', team_locks, 'XX', int(wanted - team.lock_ttl_ms), user)
redis.call('HSET', team_hash, 'locked_at:' .. user, int(locked_at), 'extended', '1')
redis.call('ZADD', A.lock_expiries, int(wanted), expiry_entry(team_id, user))
reindex(team_id, team_locks, team.lock_ttl_ms)
redis.call('SET', user_lock, team_id .. '|' .. int(locked_at) .. '|' .. int(wanted) .. '|' ..
           int(team.deadline_ms), 'PX', int(wanted - now))
local version = bump(team_hash)
emit({'type', 'lock.extended', 'at_ms', int(now), 'activity_id', activity_id,
      'team_id', team_id, 'user_id', user, 'locked_at_ms', int(locked_at),
      'expires_at_ms', int(wanted), 'version', version})
return {OK, int(locked_at), int(wanted), version, 1}
