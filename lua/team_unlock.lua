#!lua
-- team_unlock: release a user's seat lock on a team (idempotent).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_UNLOCK); the first ones are
-- named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
local user_lock = KEYS[18]
local user_id = ARGV[5]
-- Returns {OK, 1} released an unexpired lock, {OK, 0} there was none, {TEAM_NOT_FOUND}.
local now = now_ms(shift_ms)
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
local released = redis.call('ZREM', team_locks, user_id)
if released == 1 then
  redis.call('ZREM', A.lock_expiries, expiry_entry(team_id, user_id))
  drop_held(team, {user_id})
  reindex(team_id, team_locks, team.lock_ttl_ms)
  bump(team_hash)
  index_seats(team)
  hand_off(team)
end
local current = redis.call('GET', user_lock)
if current and split(current)[1] == team_id then
  redis.call('DEL', user_lock)
end
return {OK, released}
