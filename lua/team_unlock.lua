#!lua
-- team_unlock: release a user's seat lock on a team (idempotent).
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib  KEYS[11] user's current-lock key
-- ARGV[1..3] as _team_lib  ARGV[4] user_id
-- Returns {OK, 1} released an unexpired lock, {OK, 0} there was none, {TEAM_NOT_FOUND}.
local now = now_ms(ARGV[3])
local team = load_team(now)
if not team then
  return {TEAM_NOT_FOUND}
end
local released = redis.call('ZREM', KEYS[3], ARGV[4])
if released == 1 then
  reindex(ARGV[2], KEYS[3], team.lock_ttl_ms)
  bump(KEYS[1])
  index_seats(team)
end
local current = redis.call('GET', KEYS[11])
if current and split(current)[1] == ARGV[2] then
  redis.call('DEL', KEYS[11])
end
return {OK, released}
