#!lua
-- team_confirm: payment succeeded, turn the user's unexpired lock into membership.
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib  KEYS[11] user's current-lock key
-- KEYS[12] blocked users hash (user_id -> when, and why; in Redis Cluster the copy of the
--         activity's slot, see Keys.blocked_users)
-- ARGV[1..3] as _team_lib  ARGV[4] user_id  ARGV[5] order_id
-- Returns {OK, formed 0|1, team...} joined (formed: this member completed the team),
-- {EXISTING, formed 0|1, team...} the same user and order joined before (formed: that
-- earlier confirm completed the team, recorded as formed_by), where team... is the team
-- after the call as team_read answers it,
-- {ALREADY_MEMBER} a member with another order, {LOCK_REQUIRED}, {TEAM_FORMED},
-- {TEAM_FAILED}, {TEAM_NOT_FOUND}, {USER_LIMIT_REACHED, limit, current, limit name},
-- {USER_BLOCKED} an admin blocked the user (the backend refunds, as for LOCK_REQUIRED; a
-- repeat of a confirm that succeeded before the block still answers EXISTING).
local now = now_ms(ARGV[3])
local user = ARGV[4]
local team = load_team(now)
if not team then
  return {TEAM_NOT_FOUND}
end
local member = redis.call('HGET', KEYS[2], user)
if member then
  if split(member)[3] == ARGV[5] then
    local formed_by = redis.call('HGET', KEYS[1], 'formed_by')
    return {EXISTING, formed_by == user and 1 or 0, snapshot()}
  end
  return {ALREADY_MEMBER}
end
if redis.call('HEXISTS', KEYS[12], user) == 1 then
  return {USER_BLOCKED}
end
if closed_code(team) then
  return {closed_code(team)}
end
if not redis.call('ZSCORE', KEYS[3], user) then
  return {LOCK_REQUIRED}
end
local refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
if refused then
  return refused
end

redis.call('ZREM', KEYS[3], user)
reindex(ARGV[2], KEYS[3], team.lock_ttl_ms)
local seq = redis.call('HINCRBY', KEYS[1], 'member_count', 1)
count(team, user, 'teams', team.teams_limit, 1)
redis.call('HSET', KEYS[2], user, int(seq) .. '|' .. int(now) .. '|' .. ARGV[5])
local current = redis.call('GET', KEYS[11])
if current and split(current)[1] == ARGV[2] then
  redis.call('DEL', KEYS[11])
end
emit({'type', 'team.member_joined', 'at_ms', int(now), 'activity_id', ARGV[1],
      'team_id', ARGV[2], 'user_id', user, 'order_id', ARGV[5], 'seq', int(seq),
      'version', bump(KEYS[1])})
if seq < team.size then
  return {OK, 0, snapshot()}
end
ended_counts(team, false)
close_team(team, 'formed', 'formed_ms', now)
redis.call('HSET', KEYS[1], 'formed_by', user)
emit({'type', 'team.formed', 'at_ms', int(now), 'activity_id', ARGV[1], 'team_id', ARGV[2],
      'members', member_list(team), 'version', bump(KEYS[1])})
return {OK, 1, snapshot()}
