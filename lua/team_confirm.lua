#!lua
-- team_confirm: payment succeeded, turn the user's unexpired lock into membership (or, on an
-- activity with late_confirm, join without one while a seat and a unit are free).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_CONFIRM); the first ones are
-- named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _sale_lib
local user_lock = KEYS[18]
local user_id = ARGV[5]
local order_id = ARGV[6]
-- Returns {OK, formed 0|1, late 0|1, team...} joined (formed: this member completed the
-- team; late: a late confirm, without a live lock),
-- {EXISTING, formed 0|1, team...} the same user and order joined before (formed: that
-- earlier confirm completed the team, recorded as formed_by), where team... is the team
-- after the call as team_read answers it,
-- {ALREADY_MEMBER} a member with another order, {LEFT_TEAM} the user left this team (no
-- seat in it again), {LOCK_REQUIRED} no live lock (and no late join: the activity has no
-- late_confirm, or the team has no free seat, the stock no unit, or the user is at a limit),
-- {TEAM_FORMED},
-- {TEAM_FAILED}, {TEAM_NOT_FOUND}, {USER_LIMIT_REACHED, limit, current, limit name},
-- {USER_BLOCKED} an admin blocked the user (the backend refunds, as for LOCK_REQUIRED; a
-- repeat of a confirm that succeeded before the block still answers EXISTING).
local now = now_ms(shift_ms)
local user = user_id
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
local member = redis.call('HGET', team_members, user)
if member then
  if split(member)[3] == order_id then
    local formed_by = redis.call('HGET', team_hash, 'formed_by')
    return {EXISTING, formed_by == user and 1 or 0, snapshot(team)}
  end
  return {ALREADY_MEMBER}
end
if has_left(team, user) then
  return {LEFT_TEAM}
end
if redis.call('HEXISTS', activity_blocklist, user) == 1 then
  return {USER_BLOCKED}
end
if closed_code(team) then
  return {closed_code(team)}
end
local late = 0
if redis.call('ZSCORE', team_locks, user) then
  local refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
  if refused then
    return refused
  end
  redis.call('ZREM', team_locks, user)
  redis.call('ZREM', A.lock_expiries, expiry_entry(team_id, user))
  drop_held(team, {user})
  reindex(team_id, team_locks, team.lock_ttl_ms)
else
  -- Late confirm (SPEC §3 Teams): no live lock (load_team purged an expired one), yet the
  -- activity takes the payment while a seat of this open team and a unit of the stock are
  -- free now and the user is within the limits; else LOCK_REQUIRED, and nothing written.
  local sale = redis.call('HMGET', activity_hash, 'late_confirm', 'stock')
  if sale[1] ~= '1'
      or team.member_count + redis.call('ZCARD', team_locks) >= team.size
      or (sale[2] and stock_refusal(now, sale[2], 0))
      or over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user') then
    return {LOCK_REQUIRED}
  end
  late = 1
end
tally('members', 1)
local joined = redis.call('HINCRBY', team_hash, 'member_count', 1)
local seq = joined + team.departed  -- the seqs of members who left are not given again
count(team, user, 'teams', team.teams_limit, 1)
redis.call('HSET', team_members, user, int(seq) .. '|' .. int(now) .. '|' .. order_id)
local current = redis.call('GET', user_lock)
if current and split(current)[1] == team_id then
  redis.call('DEL', user_lock)
end
-- A seat the waitlist offered: its offer is taken (the record says so, for the metrics).
local offered = redis.call('HGET', A.waitlist, user)
local taken = offered and string.sub(offered, 1, #team_id + 3) == 'o|' .. team_id .. '|'
if taken then
  redis.call('HDEL', A.waitlist, user)
end
emit({'type', 'team.member_joined', 'at_ms', int(now), 'activity_id', activity_id,
      'team_id', team_id, 'user_id', user, 'order_id', order_id, 'seq', int(seq),
      'version', bump(team_hash), 'offered', taken and '1' or '0'})
if joined < team.size then
  if late == 1 then
    index_seats(team)  -- one more seat taken
  end
  return {OK, 0, late, snapshot(team)}
end
ended_counts(team, false)
tally('teams_open', -1)
tally('teams_formed', 1)
close_team(team, 'formed', 'formed_ms', now)
redis.call('HSET', team_hash, 'formed_by', user)
emit({'type', 'team.formed', 'at_ms', int(now), 'activity_id', activity_id, 'team_id', team_id,
      'members', member_list(team), 'version', bump(team_hash)})
return {OK, 1, late, snapshot(team)}
