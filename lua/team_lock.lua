#!lua
-- team_lock: hold one free seat of a team for a user, atomically.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_LOCK); the first ones are named
-- in _team_keys. other_hash and other_locks are passed only when other_team_id names a team.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _sale_lib
local user_lock = KEYS[18]
local other_hash = KEYS[19]
local other_locks = KEYS[20]
local user_id = ARGV[5]
local other_team_id = ARGV[6]
-- Returns {OK, locked_at_ms, expires_at_ms, released_team_id or '', version} new lock
-- (version: the team's after the lock),
-- {EXISTING, locked_at_ms, expires_at_ms, version} unexpired lock on this team (unchanged),
-- {TEAM_FULL, earliest_locked_at_ms or '', next_unlock_ms or ''},
-- {SWITCH_NEEDED, team_id}: the user holds a live lock in that other team; call again with its keys,
-- {ALREADY_MEMBER}, {LEFT_TEAM} the user left this team, {TEAM_FORMED}, {TEAM_FAILED},
-- {TEAM_NOT_FOUND},
-- {USER_LIMIT_REACHED, limit, current, limit name}: a seat the user may not take,
-- {USER_BLOCKED}: an admin blocked the user (an unexpired lock is still answered EXISTING),
-- {ACTIVITY_NOT_FOUND}: Redis has no copy of the activity (put it back from SQL, call again),
-- {ACTIVITY_CLOSED}: an admin closed the activity (before any other answer),
-- {ACTIVITY_NOT_STARTED, starts_ms}, {ACTIVITY_ENDED}: outside the sale's schedule (right
-- after ACTIVITY_CLOSED), {ACTIVITY_SOLD_OUT, next_unlock_ms or ''}: no unit of the stock
-- left (the user's own live lock in the activity not counted: a re-lock or a switch gives it
-- back); all three before any write.
-- The activity's copy is read first, in this call: a close that answered before this call
-- ran is seen, and no lock is taken after it.
local activity = redis.call('HMGET', activity_hash, 'team_size', 'status', 'starts_ms',
                            'ends_ms', 'stock')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
if activity[2] == 'closed' then
  return {ACTIVITY_CLOSED}
end
local now = now_ms(shift_ms)
local user = user_id
local outside = schedule_refusal(now, activity[3], activity[4])
  or (activity[5] and stock_refusal(now, activity[5], own_lock(now, user_lock, user)))
if outside then
  return outside
end
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
local refused = seat_refusal(team, user)
if refused then
  return {refused}
end

local held = redis.call('ZSCORE', team_locks, user)
if held then
  held = tonumber(held)
  return {EXISTING, int(held_since(team, user, held)), int(held + team.lock_ttl_ms),
          tonumber(redis.call('HGET', team_hash, 'version'))}
end

if redis.call('HEXISTS', activity_blocklist, user) == 1 then
  return {USER_BLOCKED}
end
local over = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
if over then
  return over
end

local lock_count = redis.call('ZCARD', team_locks)
local free = team.member_count + lock_count < team.size
if free and line_waits(team) then
  free = line_first(team)  -- the line first (the user too, if queued here)
  held = redis.call('ZSCORE', team_locks, user)
  if held then
    held = tonumber(held)
    return {EXISTING, int(held_since(team, user, held)), int(held + team.lock_ttl_ms),
            tonumber(redis.call('HGET', team_hash, 'version'))}
  end
  if sold_out(now) then  -- the offers took the units the check above counted
    return {ACTIVITY_SOLD_OUT, next_unlock(now)}
  end
  lock_count = redis.call('ZCARD', team_locks)
end
if not free then
  local first = redis.call('ZRANGE', team_locks, 0, 0, 'WITHSCORES')
  if first[2] then
    -- The lock that expires first (its score: expiry - lock_ttl_ms), and when it began.
    local earliest = tonumber(first[2])
    return {TEAM_FULL, int(held_since(team, first[1], earliest)),
            int(earliest + team.lock_ttl_ms)}
  end
  return {TEAM_FULL, '', ''}
end

-- A live lock in another team of this activity must be released first; its keys
-- were not known to the caller if it did not name that team, so ask for them.
local released, freed = '', nil
local current = redis.call('GET', user_lock)
if current then
  local parts = split(current)
  local other = parts[1]
  if other ~= team_id and tonumber(parts[3]) > now then
    if other ~= other_team_id then
      return {SWITCH_NEEDED, other}
    end
    local other_score = redis.call('ZSCORE', other_locks, user)
    if other_score then
      -- Only an open team keeps locks; one past its deadline has failed in effect.
      local o = redis.call('HMGET', other_hash, 'lock_ttl_ms', 'deadline_ms',
                           'locked_at:' .. user)
      local expiry = tonumber(other_score) + tonumber(o[1])
      local locked_at = tonumber(o[3] or other_score)  -- an extended lock's true locked_at
      local deadline = tonumber(o[2])
      if o[3] then
        redis.call('HDEL', other_hash, 'locked_at:' .. user)
      end
      redis.call('ZREM', other_locks, user)
      redis.call('ZREM', A.lock_expiries, expiry_entry(other, user))
      reindex(other, other_locks, tonumber(o[1]))
      index_seats(team_keys_of(other))
      freed = now < deadline and other or nil  -- a seat there for its line
      if expiry > math.min(now, deadline) then
        if now < deadline then
          released = other
          bump(other_hash)  -- a release, as an unlock there would be
        end
        -- else: still live at that team's deadline, it ends with the team (no record).
      else
        -- Expired before anyone swept it there: record its expiry, as the sweep would.
        emit({'type', 'lock.expired', 'at_ms', int(expiry), 'activity_id', activity_id,
              'team_id', other, 'user_id', user, 'locked_at_ms', int(locked_at),
              'version', bump(other_hash)})
      end
    end
  end
end

local expires, version = take_seat(team, user, now, lock_count, user_lock)
if freed then
  hand_off(load_team(now, team_keys_of(freed)))  -- the seat released (or expired) there
end
return {OK, int(now), int(expires), released, version}
