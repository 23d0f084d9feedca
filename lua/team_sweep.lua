#!lua flags=allow-oom
-- team_sweep: apply what time did to one team (expired locks, a passed deadline).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_SWEEP), named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- Returns {OK, locks expired now, status, 1 when this call ended it at its deadline else 0},
-- or {TEAM_NOT_FOUND} (its index entries are dropped).
local now = now_ms(shift_ms)
-- Entries of locks whose team Redis lost: no script removes them one by one.
redis.call('ZREMRANGEBYSCORE', A.lock_expiries, '-inf', now)
local team = load_team(now, named_team())
if not team then
  forget_team(team_id)
  return {TEAM_NOT_FOUND}
end
return {OK, team.expired_locks, team.status, team.ended_now and 1 or 0}
