#!lua
-- team_lock: hold one free seat of a team for a user, atomically.
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib  KEYS[11] user's current-lock key
--         ("team_id|locked_at_ms|expires_at_ms|team_deadline_ms", PX = lock ttl)
-- KEYS[12] blocked users hash (user_id -> when, and why; in Redis Cluster the copy of the
--         activity's slot, see Keys.blocked_users)
-- KEYS[13] hash and KEYS[14] locks zset of the team the caller believes the user holds a lock
--          in (only when ARGV[5] names it)
-- ARGV[1..3] as _team_lib  ARGV[4] user_id  ARGV[5] that other team's id, or ''
-- Returns {OK, locked_at_ms, expires_at_ms, released_team_id or '', version} new lock
-- (version: the team's after the lock),
-- {EXISTING, locked_at_ms, expires_at_ms, version} unexpired lock on this team (unchanged),
-- {TEAM_FULL, earliest_locked_at_ms or '', next_unlock_ms or ''},
-- {SWITCH_NEEDED, team_id}: the user holds a live lock in that other team; call again with its keys,
-- {ALREADY_MEMBER}, {TEAM_FORMED}, {TEAM_FAILED}, {TEAM_NOT_FOUND},
-- {USER_LIMIT_REACHED, limit, current, limit name}: a seat the user may not take,
-- {USER_BLOCKED}: an admin blocked the user (an unexpired lock is still answered EXISTING).
local now = now_ms(ARGV[3])
local user = ARGV[4]
local team = load_team(now)
if not team then
  return {TEAM_NOT_FOUND}
end
if redis.call('HEXISTS', KEYS[2], user) == 1 then
  return {ALREADY_MEMBER}
end
if closed_code(team) then
  return {closed_code(team)}
end

local held = redis.call('ZSCORE', KEYS[3], user)
if held then
  held = tonumber(held)
  return {EXISTING, int(held), int(held + team.lock_ttl_ms),
          tonumber(redis.call('HGET', KEYS[1], 'version'))}
end

if redis.call('HEXISTS', KEYS[12], user) == 1 then
  return {USER_BLOCKED}
end
local refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
if refused then
  return refused
end

local lock_count = redis.call('ZCARD', KEYS[3])
if team.member_count + lock_count >= team.size then
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then
    local earliest = tonumber(first[2])
    return {TEAM_FULL, int(earliest), int(earliest + team.lock_ttl_ms)}
  end
  return {TEAM_FULL, '', ''}
end

-- A live lock in another team of this activity must be released first; its keys
-- were not known to the caller if it did not name that team, so ask for them.
local released = ''
local current = redis.call('GET', KEYS[11])
if current then
  local parts = split(current)
  local other = parts[1]
  if other ~= ARGV[2] and tonumber(parts[3]) > now then
    if other ~= ARGV[5] then
      return {SWITCH_NEEDED, other}
    end
    local other_score = redis.call('ZSCORE', KEYS[14], user)
    if other_score then
      -- Only an open team keeps locks; one past its deadline has failed in effect.
      local o = redis.call('HMGET', KEYS[13], 'lock_ttl_ms', 'deadline_ms')
      local locked_at = tonumber(other_score)
      local expiry = locked_at + tonumber(o[1])
      local deadline = tonumber(o[2])
      redis.call('ZREM', KEYS[14], user)
      reindex(other, KEYS[14], tonumber(o[1]))
      index_seats({id = other, hash = KEYS[13], locks = KEYS[14]})
      if expiry > math.min(now, deadline) then
        if now < deadline then
          released = other
          bump(KEYS[13])  -- a release, as an unlock there would be
        end
        -- else: still live at that team's deadline, it ends with the team (no record).
      else
        -- Expired before anyone swept it there: record its expiry, as the sweep would.
        emit({'type', 'lock.expired', 'at_ms', int(expiry), 'activity_id', ARGV[1],
              'team_id', other, 'user_id', user, 'locked_at_ms', int(locked_at),
              'version', bump(KEYS[13])})
      end
    end
  end
end

local expires, version = take_seat(team, user, now, lock_count, KEYS[11])
return {OK, int(now), int(expires), released, version}
