#!lua
-- team_dissolve: an admin fails an open team now (reason dissolved), idempotently.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.dissolve.TEAM_DISSOLVE), named in
-- _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- Returns {OK, team...} failed now (its team.failed record lists the members to refund),
-- {EXISTING, team...} dissolved before, {TEAM_FORMED}, {TEAM_FAILED} it failed otherwise
-- (its deadline passed, found now or before, or its last member left), {TEAM_NOT_FOUND};
-- team...: the team after the call as team_read answers it.
local now = now_ms(shift_ms)
local team = load_team(now, named_team())
if not team then
  return {TEAM_NOT_FOUND}
end
if team.status == 'formed' then
  return {TEAM_FORMED}
end
if team.status == 'failed' then
  if redis.call('HGET', team_hash, 'failed_reason') == 'dissolved' then
    return {EXISTING, snapshot(team)}
  end
  return {TEAM_FAILED}
end
fail_team(team, now, 'dissolved')
return {OK, snapshot(team)}
