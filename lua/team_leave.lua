#!lua
-- team_leave: the shop refunded a member: they leave an open team (its seat and stock unit
-- free at once) or stay listed, refunded, in a formed one; idempotent by (user, order).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.leave.TEAM_LEAVE); the first ones are named
-- in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
local user_id = ARGV[5]
local order_id = ARGV[6]
local reason = ARGV[7]
-- Returns {OK, kind, team...} done now, {EXISTING, kind, team...} the same user and order
-- left before (kind: 'left' from an open team, 'refunded' in a formed one; team...: the team
-- after the call as team_read answers it), {NOT_A_MEMBER}, {ORDER_MISMATCH} the member
-- joined with another order (or none), {TEAM_FAILED} (its members were refunded by the
-- failure), {TEAM_NOT_FOUND}.
-- The memory of a leave is the team hash's field left:<user>, 'kind|at_ms|order_id'.
-- A leader who leaves an open team hands it to the earliest remaining member
-- (team.leader_changed); the last member who leaves fails it (team.failed, abandoned).
local now = now_ms(shift_ms)
local user = user_id
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
local gone = redis.call('HGET', team_hash, 'left:' .. user)
if gone then
  local before = split(gone)
  if before[3] == order_id then
    return {EXISTING, before[1], snapshot(team)}
  end
  return {ORDER_MISMATCH}
end
local member = redis.call('HGET', team_members, user)
if not member then
  return {NOT_A_MEMBER}
end
if split(member)[3] ~= order_id then
  return {ORDER_MISMATCH}
end
if team.status == 'failed' then
  return {TEAM_FAILED}
end

local record = {'at_ms', int(now), 'activity_id', activity_id, 'team_id', team_id,
                'user_id', user, 'order_id', order_id, 'reason', reason}
if team.status == 'formed' then
  -- The others bought at the group price: the team stays formed, the member stays listed.
  redis.call('HSET', team_hash, 'left:' .. user, 'refunded|' .. int(now) .. '|' .. order_id)
  tally('members', -1)
  count(team, user, 'teams', team.teams_limit, -1)
  emit({'type', 'team.member_refunded', 'version', bump(team_hash), unpack(record)})
  hand_units(team, 1)
  return {OK, 'refunded', snapshot(team)}
end

redis.call('HDEL', team_members, user)
team.member_count = redis.call('HINCRBY', team_hash, 'member_count', -1)
redis.call('HINCRBY', team_hash, 'departed', 1)
redis.call('HSET', team_hash, 'left:' .. user, 'left|' .. int(now) .. '|' .. order_id)
tally('members', -1)
count(team, user, 'teams', team.teams_limit, -1)
emit({'type', 'team.member_left', 'version', bump(team_hash), unpack(record)})
if redis.call('HGET', team_hash, 'leader_id') == user then
  if team.member_count == 0 then
    fail_team(team, now, 'abandoned')  -- gives the leaver's 'led' back
    return {OK, 'left', snapshot(team)}
  end
  local flat = redis.call('HGETALL', team_members)
  local next_leader, next_order, lowest = nil, nil, nil
  for i = 1, #flat, 2 do
    local parts = split(flat[i + 1])
    local seq = tonumber(parts[1])
    if not lowest or seq < lowest then
      next_leader, next_order, lowest = flat[i], parts[3], seq
    end
  end
  redis.call('HSET', team_hash, 'leader_id', next_leader, 'leader_order_id', next_order)
  count(team, user, 'led', team.led_limit, -1)
  count(team, next_leader, 'led', team.led_limit, 1)
  emit({'type', 'team.leader_changed', 'at_ms', int(now), 'activity_id', activity_id,
        'team_id', team_id, 'leader_id', next_leader, 'previous_leader_id', user,
        'version', bump(team_hash)})
end
index_seats(team)
hand_off(team)
return {OK, 'left', snapshot(team)}
