#!lua
-- waitlist_join: wait in line for the next free seat of a team ('' team: of any team).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_JOIN); the first ones are
-- named in _team_keys (team_id '' for any team).
-- requires: _common
-- requires: _waitlist_offer
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _sale_lib
local user_lock = KEYS[18]
local user_id = ARGV[5]
local force = ARGV[6]
-- Returns {QUEUED, position, expires_at_ms, team_id, queued_at_ms, new} waiting now (new 0:
-- a repeat found the same entry), {OFFERED, team_id, locked_at_ms, expires_at_ms, version, queued_at_ms} the line gave
-- the user a lock, {TAKE_SEAT} a seat is free for the user now and nobody waits: lock (or
-- join) instead (force '1': queue anyway, the lock found none),
-- {WAITLIST_FULL, max_len}, {ALREADY_LOCKED, team_id} the user holds a live lock of the
-- activity, {USER_BLOCKED}, {USER_LIMIT_REACHED, limit, current, limit name},
-- {ALREADY_MEMBER}, {LEFT_TEAM}, {TEAM_FORMED}, {TEAM_FAILED}, {TEAM_NOT_FOUND},
-- {ACTIVITY_NOT_FOUND}, {ACTIVITY_CLOSED}, {ACTIVITY_NOT_STARTED, starts_ms},
-- {ACTIVITY_ENDED}: as a lock answers them.
local activity = redis.call('HMGET', activity_hash, 'team_size', 'status', 'starts_ms',
                            'ends_ms', 'stock', 'waitlist_max', 'waitlist_ttl_ms',
                            'teams_per_user')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
if activity[2] == 'closed' then
  return {ACTIVITY_CLOSED}
end
local now = now_ms(shift_ms)
local user = user_id
local outside = schedule_refusal(now, activity[3], activity[4])
if outside then
  return outside
end

local line = team_id == '' and A.line or team_line(team_id)
local entry = redis.call('HGET', A.waitlist, user)
if entry then
  local parts = split(entry)
  if parts[1] == 'q' and tonumber(parts[4]) > now then
    return {QUEUED, redis.call('ZRANK', line_of(parts[2]), user) + 1, parts[4], parts[2],
            parts[3], 0}
  elseif parts[1] == 'o' and offer_held(parts, redis.call('GET', user_lock), now) then
    return {OFFERED, parts[2], parts[3], parts[4], parts[5], parts[6]}
  elseif parts[1] == 'q' then
    end_entry(user, parts, 'waitlist.expired', tonumber(parts[4]))
  else
    redis.call('HDEL', A.waitlist, user)  -- an offer that ended (expired, released, moved)
  end
end
local current = redis.call('GET', user_lock)
if current and tonumber(split(current)[3]) > now then
  return {ALREADY_LOCKED, split(current)[1]}
end
if redis.call('HEXISTS', activity_blocklist, user) == 1 then
  return {USER_BLOCKED}
end

local free, team
if team_id ~= '' then
  team = load_team(now, named_team())
  if not team then
    return {TEAM_NOT_FOUND}
  end
  local refused = seat_refusal(team, user)
  if refused then
    return {refused}
  end
  refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
  if refused then
    return refused
  end
  free = team.member_count + redis.call('ZCARD', team_locks) < team.size
  if free and line_waits(team) then
    free = line_first(team)
  end
else
  local limit = tonumber(activity[8] or '0')
  local refused = over_limit({}, user, 'teams', limit, 'teams_per_user')
  if refused then
    return refused
  end
  free = redis.call('ZCARD', A.open_seats) > 0  -- a join hands the line its seats first
end
if force ~= '1' and free and not (activity[5] and stock_refusal(now, activity[5], 0)) then
  return {TAKE_SEAT}
end

local max_len = tonumber(activity[6] or '10000')
if tonumber(redis.call('HGET', A.waitlist, '~waiting') or '0') >= max_len then
  return {WAITLIST_FULL, max_len}
end
local seq = redis.call('HINCRBY', A.waitlist, '~seq', 1)
local expires = now + tonumber(activity[7] or '600000')
redis.call('HINCRBY', A.waitlist, '~waiting', 1)
redis.call('HSET', A.waitlist, user, 'q|' .. team_id .. '|' .. int(now) .. '|' ..
           int(expires) .. '|' .. seq)
redis.call('ZADD', line, seq, user)
redis.call('ZADD', A.waitlist_due, int(expires), user)
redis.call('ZADD', A.due_locks, 'LT', int(expires), activity_id)
for _, key in ipairs({A.waitlist, line, A.waitlist_due}) do
  keep_until(key, expires, now)
end
-- A seat free now (a lost race for it, a unit the stock held back) goes to the line at once.
if team then
  hand_off(team)
else
  hand_units({now = now}, 1)
end
local mine = split(redis.call('HGET', A.waitlist, user))
if mine[1] == 'o' then
  return {OFFERED, mine[2], mine[3], mine[4], mine[5], mine[6]}
end
return {QUEUED, redis.call('ZRANK', line, user) + 1, int(expires), team_id, int(now), 1}
