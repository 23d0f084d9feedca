#!lua
-- team_open: open a team whose leader is member 1, idempotently.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_OPEN); the first ones are named
-- in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _sale_lib
local leader_id = ARGV[5]
local leader_order_id = ARGV[6]
local retention_ms = ARGV[7]
-- Returns {OK, team...} opened, {EXISTING, team...} same leader and order already opened it
-- (team...: the team now, after the lazy checks, as team_read answers it),
-- {CONFLICT} the team id is taken with other parameters, {ACTIVITY_NOT_FOUND},
-- {USER_LIMIT_REACHED, limit, current, limit name} the leader is at a per-user limit,
-- {USER_BLOCKED} an admin blocked the leader (who would be member 1),
-- {ACTIVITY_CLOSED} an admin closed the activity (before any other answer: no team opens,
-- not even a repeat),
-- {ACTIVITY_NOT_STARTED, starts_ms}, {ACTIVITY_ENDED} outside the sale's schedule (right
-- after ACTIVITY_CLOSED, as it, even for a repeat),
-- {ACTIVITY_SOLD_OUT, next_unlock_ms or ''} no unit of the stock left for the leader (a
-- repeat still answers EXISTING: its leader holds a unit already).
local now = now_ms(shift_ms)
local activity = redis.call('HMGET', activity_hash, 'team_size', 'lock_ttl_ms', 'team_deadline_ms',
                            'virtual_min', 'teams_per_user', 'open_per_leader', 'status',
                            'starts_ms', 'ends_ms', 'stock', 'offer_ttl_ms')
if not activity[1] then
  return {ACTIVITY_NOT_FOUND}
end
if activity[7] == 'closed' then
  return {ACTIVITY_CLOSED}
end
local outside = schedule_refusal(now, activity[8], activity[9])
if outside then
  return outside
end
local existing = redis.call('HMGET', team_hash, 'leader_id', 'leader_order_id')
if existing[1] then
  if existing[1] == leader_id and existing[2] == leader_order_id then
    load_team(now, named_team())
    return {EXISTING, snapshot(named_team())}
  end
  return {CONFLICT}
end
local sold_out = activity[10] and stock_refusal(now, activity[10], 0)
if sold_out then
  return sold_out
end
if redis.call('HEXISTS', activity_blocklist, leader_id) == 1 then
  return {USER_BLOCKED}
end

local teams_limit = tonumber(activity[5] or '0')
local led_limit = tonumber(activity[6] or '0')
local team = named_team()
local refused = over_limit(team, leader_id, 'teams', teams_limit, 'teams_per_user')
  or over_limit(team, leader_id, 'led', led_limit, 'open_teams_per_leader')
if refused then
  return refused
end

local deadline = now + tonumber(activity[3])
local expire_at = deadline + tonumber(retention_ms)
redis.call('HSET', team_hash, 'leader_id', leader_id, 'leader_order_id', leader_order_id, 'status', 'open',
           'size', activity[1], 'lock_ttl_ms', activity[2], 'created_ms', int(now),
           'deadline_ms', int(deadline), 'expire_at_ms', int(expire_at), 'member_count', 1,
           'version', 1, 'virtual_min', activity[4] or 0, 'teams_limit', teams_limit,
           'led_limit', led_limit, 'offer_ttl_ms', activity[11] or activity[2])
count(team, leader_id, 'teams', teams_limit, 1)
count(team, leader_id, 'led', led_limit, 1)
redis.call('HSET', team_members, leader_id, '1|' .. int(now) .. '|' .. leader_order_id)
index_deadline(team_id, deadline)
index_seats(team)
tally('teams_open', 1)
tally('members', 1)
-- A live team: its activity's counts stay until activity_release (activity_counts_put).
redis.call('PERSIST', A.counts)
redis.call('PEXPIREAT', team_hash, expire_at)
redis.call('PEXPIREAT', team_members, expire_at)
emit({'type', 'team.opened', 'at_ms', int(now), 'activity_id', activity_id, 'team_id', team_id,
      'leader_id', leader_id, 'order_id', leader_order_id, 'size', activity[1],
      'deadline_ms', int(deadline), 'version', 1})
if redis.call('EXISTS', A.line) == 1 then
  hand_off(load_team(now, named_team()))  -- its free seats are for those waiting
end
return {OK, snapshot(team)}
