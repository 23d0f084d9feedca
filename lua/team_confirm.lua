#!lua
-- team_confirm: payment succeeded, turn the user's unexpired lock into membership.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_CONFIRM); the first ones are
-- named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
local user_lock = KEYS[13]
local blocklist = KEYS[14]
local user_id = ARGV[5]
local order_id = ARGV[6]
-- Returns {OK, formed 0|1, team...} joined (formed: this member completed the team),
-- {EXISTING, formed 0|1, team...} the same user and order joined before (formed: that
-- earlier confirm completed the team, recorded as formed_by), where team... is the team
-- after the call as team_read answers it,
-- {ALREADY_MEMBER} a member with another order, {LEFT_TEAM} the user left this team (no
-- seat in it again), {LOCK_REQUIRED}, {TEAM_FORMED},
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
if redis.call('HEXISTS', blocklist, user) == 1 then
  return {USER_BLOCKED}
end
if closed_code(team) then
  return {closed_code(team)}
end
if not redis.call('ZSCORE', team_locks, user) then
  return {LOCK_REQUIRED}
end
local refused = over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user')
if refused then
  return refused
end

redis.call('ZREM', team_locks, user)
redis.call('ZREM', A.lock_expiries, expiry_entry(team_id, user))
drop_held(team, {user})
tally('members', 1)
reindex(team_id, team_locks, team.lock_ttl_ms)
local joined = redis.call('HINCRBY', team_hash, 'member_count', 1)
local seq = joined + team.departed  -- the seqs of members who left are not given again
count(team, user, 'teams', team.teams_limit, 1)
redis.call('HSET', team_members, user, int(seq) .. '|' .. int(now) .. '|' .. order_id)
local current = redis.call('GET', user_lock)
if current and split(current)[1] == team_id then
  redis.call('DEL', user_lock)
end
emit({'type', 'team.member_joined', 'at_ms', int(now), 'activity_id', activity_id,
      'team_id', team_id, 'user_id', user, 'order_id', order_id, 'seq', int(seq),
      'version', bump(team_hash)})
if joined < team.size then
  return {OK, 0, snapshot(team)}
end
ended_counts(team, false)
tally('teams_open', -1)
tally('teams_formed', 1)
close_team(team, 'formed', 'formed_ms', now)
redis.call('HSET', team_hash, 'formed_by', user)
emit({'type', 'team.formed', 'at_ms', int(now), 'activity_id', activity_id, 'team_id', team_id,
      'members', member_list(team), 'version', bump(team_hash)})
return {OK, 1, snapshot(team)}
