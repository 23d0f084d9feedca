-- user_lock_read: confirm that the lock a user's current-lock key points to is live.
-- requires: _common
-- requires: _team_lib
-- KEYS[1..6] as _team_lib, for the team the key names  KEYS[7] user's current-lock key
-- ARGV[1..3] as _team_lib  ARGV[4] user_id
-- Returns {OK, locked_at_ms, expires_at_ms}, or {NO_LOCK} (a stale key is removed).
local now = now_ms(ARGV[3])
local team = load_team(now)
local held = team and team.status == 'open' and redis.call('ZSCORE', KEYS[3], ARGV[4])
if held then
  held = tonumber(held)
  return {OK, int(held), int(held + team.lock_ttl_ms)}
end
local current = redis.call('GET', KEYS[7])
if current and split(current)[1] == ARGV[2] then
  redis.call('DEL', KEYS[7])
end
return {NO_LOCK}
