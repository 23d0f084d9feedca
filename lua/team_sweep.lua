#!lua flags=allow-oom
-- team_sweep: apply what time did to one team (expired locks, a passed deadline).
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib
-- ARGV[1..3] as _team_lib
-- Returns {OK, locks expired now, status, 1 when this call ended it at its deadline else 0},
-- or {TEAM_NOT_FOUND} (its index entries are dropped).
local team = load_team(now_ms(ARGV[3]))
if not team then
  forget_team(ARGV[2])
  return {TEAM_NOT_FOUND}
end
return {OK, team.expired_locks, team.status, team.ended_now and 1 or 0}
