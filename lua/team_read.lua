#!lua flags=allow-oom
-- team_read: a team's current state after the lazy checks (deadline, expired locks).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_READ), named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- Returns {OK, now_ms, team hash as flat list, members hash as flat list, locks as flat
-- [user, locked_at_ms, ...] oldest first}, or {TEAM_NOT_FOUND}.
local now = now_ms(shift_ms)
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
return {OK, int(now), snapshot(team)}
