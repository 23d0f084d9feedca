#!lua
-- team_open: open a team whose leader is member 1, idempotently.
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib  KEYS[11] activity hash (team_size, lock_ttl_ms, team_deadline_ms,
--         virtual_min, teams_per_user, open_per_leader)
-- KEYS[12] blocked users hash (user_id -> when, and why; in Redis Cluster the copy of the
--         activity's slot, see Keys.blocked_users)
-- ARGV[1..3] as _team_lib  ARGV[4] leader_id  ARGV[5] leader order_id ('' for none)
-- ARGV[6] retention_ms: how long the keys outlive the deadline
-- Returns {OK, team...} opened, {EXISTING, team...} same leader and order already opened it
-- (team...: the team now, after the lazy checks, as team_read answers it),
-- {CONFLICT} the team id is taken with other parameters, {ACTIVITY_NOT_FOUND},
-- {USER_LIMIT_REACHED, limit, current, limit name} the leader is at a per-user limit,
-- {USER_BLOCKED} an admin blocked the leader (who would be member 1).
local now = now_ms(ARGV[3])
local activity = redis.call('HMGET', KEYS[11], 'team_size', 'lock_ttl_ms', 'team_deadline_ms',
                            'virtual_min', 'teams_per_user', 'open_per_leader')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
local existing = redis.call('HMGET', KEYS[1], 'leader_id', 'leader_order_id')
if existing[1] then
  if existing[1] == ARGV[4] and existing[2] == ARGV[5] then
    load_team(now)
    return {EXISTING, snapshot()}
  end
  return {CONFLICT}
end
if redis.call('HEXISTS', KEYS[12], ARGV[4]) == 1 then
  return {USER_BLOCKED}
end

local teams_limit = tonumber(activity[5] or '0')
local led_limit = tonumber(activity[6] or '0')
local team = named_team()
local refused = over_limit(team, ARGV[4], 'teams', teams_limit, 'teams_per_user')
  or over_limit(team, ARGV[4], 'led', led_limit, 'open_teams_per_leader')
if refused then
  return refused
end

local deadline = now + tonumber(activity[3])
local expire_at = deadline + tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'leader_id', ARGV[4], 'leader_order_id', ARGV[5], 'status', 'open',
           'size', activity[1], 'lock_ttl_ms', activity[2], 'created_ms', int(now),
           'deadline_ms', int(deadline), 'expire_at_ms', int(expire_at), 'member_count', 1,
           'version', 1, 'virtual_min', activity[4] or 0, 'teams_limit', teams_limit,
           'led_limit', led_limit)
count(team, ARGV[4], 'teams', teams_limit, 1)
count(team, ARGV[4], 'led', led_limit, 1)
redis.call('HSET', KEYS[2], ARGV[4], '1|' .. int(now) .. '|' .. ARGV[5])
index_deadline(ARGV[2], deadline)
index_seats(team)
redis.call('PEXPIREAT', KEYS[1], expire_at)
redis.call('PEXPIREAT', KEYS[2], expire_at)
emit({'type', 'team.opened', 'at_ms', int(now), 'activity_id', ARGV[1], 'team_id', ARGV[2],
      'leader_id', ARGV[4], 'order_id', ARGV[5], 'size', activity[1],
      'deadline_ms', int(deadline), 'version', 1})
return {OK, snapshot()}
