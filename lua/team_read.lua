#!lua flags=allow-oom
-- team_read: a team's current state after the lazy checks (deadline, expired locks).
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib
-- ARGV[1..3] as _team_lib
-- Returns {OK, now_ms, team hash as flat list, members hash as flat list, locks as flat
-- [user, locked_at_ms, ...] oldest first}, or {TEAM_NOT_FOUND}.
local now = now_ms(ARGV[3])
if not load_team(now) then
  return {TEAM_NOT_FOUND}
end
return {OK, int(now), snapshot()}
