#!lua
-- team_join: lock a free seat for a user in the open team of the activity that is closest to
-- forming (most members + live locks, then the oldest), atomically (自动拼团).
-- The candidates come from the activity's open-seat index, at most `candidates` of them per
-- call, after time is applied where it is due (apply_time), so no call grows with the number
-- of teams. A team the user is a member of, or left, is passed over.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_JOIN); the first ones are named
-- in _pick_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _pick_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _team_pick
-- requires: _sale_lib
local user_lock = KEYS[15]
local user_id = ARGV[10]
-- Returns {OK, team_id, locked_at_ms, expires_at_ms, version} a new lock (version: the
-- team's after the lock, as team_lock answers it),
-- {EXISTING, team_id, locked_at_ms, expires_at_ms, version} the user's unexpired lock in the
-- activity, unchanged (one lock per user and activity: it is the answer wherever it is),
-- {NO_TEAM_AVAILABLE, next_unlock_ms or ''} no open team has a free seat for the user now
-- (next_unlock_ms: when the activity's earliest lock expires),
-- {LOOK_FURTHER, score, team_id} the candidates looked at had no seat for the user and more
-- are listed, or time was applied to only part of what is due: call again with that cursor
-- ('' '': from the top),
-- {USER_LIMIT_REACHED, limit, current, limit name} the user may not take a seat (as team_lock),
-- {ACTIVITY_NOT_FOUND} Redis has no copy of the activity,
-- {USER_BLOCKED} an admin blocked the user (a live lock is still answered EXISTING),
-- {ACTIVITY_CLOSED} an admin closed the activity (before any other answer),
-- {ACTIVITY_NOT_STARTED, starts_ms}, {ACTIVITY_ENDED}, {ACTIVITY_SOLD_OUT, next_unlock_ms or
-- ''}: as team_lock answers them (a live lock of the user's is not counted: it is the answer).
local activity = redis.call('HMGET', activity_hash, 'team_size', 'status', 'starts_ms',
                            'ends_ms', 'stock')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
if activity[2] == 'closed' then
  return {ACTIVITY_CLOSED}
end
local now = now_ms(shift_ms)
local looks = tonumber(candidates)
local user = user_id
local outside = schedule_refusal(now, activity[3], activity[4])
  or (activity[5] and stock_refusal(now, activity[5], own_lock(now, user_lock, user)))
if outside then
  return outside
end

local current = redis.call('GET', user_lock)
if current then
  local held = load_team(now, team_keys_of(split(current)[1]))
  local at = held and held.status == 'open' and redis.call('ZSCORE', held.locks, user)
  if at then
    at = tonumber(at)
    return {EXISTING, held.id, int(held_since(held, user, at)), int(at + held.lock_ttl_ms),
            tonumber(redis.call('HGET', held.hash, 'version'))}
  end
end
if redis.call('HEXISTS', activity_blocklist, user) == 1 then
  return {USER_BLOCKED}
end

local cut = apply_time(now, looks)
local start = rank_after(A.open_seats, cursor_score, cursor_team_id)
local listed = redis.call('ZRANGE', A.open_seats, start, start + looks - 1, 'WITHSCORES')
for i = 1, #listed, 2 do
  local team = load_team(now, team_keys_of(listed[i]))
  if not team then
    forget_team(listed[i])
  elseif team.status == 'open' and redis.call('HEXISTS', team.members, user) == 0
      and not has_left(team, user) then
    local lock_count = redis.call('ZCARD', team.locks)
    local free = team.member_count + lock_count < team.size
    if free and line_waits(team) then
      free = line_first(team)  -- the line first (the user too, if queued there)
      local at = redis.call('ZSCORE', team.locks, user)
      if at then
        at = tonumber(at)
        return {EXISTING, team.id, int(held_since(team, user, at)), int(at + team.lock_ttl_ms),
                tonumber(redis.call('HGET', team.hash, 'version'))}
      end
      if sold_out(now) then  -- the offers took the units the check above counted
        return {ACTIVITY_SOLD_OUT, next_unlock(now)}
      end
      lock_count = redis.call('ZCARD', team.locks)
    end
    if free then
      -- The activity's limit on the teams a user belongs to, as team_lock checks it.
      local refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
      if refused then
        return refused
      end
      local expires, version = take_seat(team, user, now, lock_count, user_lock)
      return {OK, team.id, int(now), int(expires), version}
    end
  end
end
if cut then
  return {LOOK_FURTHER, '', ''}
end
if #listed == 2 * looks then
  return {LOOK_FURTHER, int(tonumber(listed[#listed])), listed[#listed - 1]}
end
local first = redis.call('ZRANGE', A.lock_index, 0, 0, 'WITHSCORES')
return {NO_TEAM_AVAILABLE, first[2] and int(tonumber(first[2])) or ''}
