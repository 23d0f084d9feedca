#!lua
-- team_restore: rebuild an open team that Redis lost, from its SQL record, once.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_RESTORE); the first ones are
-- named in _team_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
local leader_id = ARGV[5]
local leader_order_id = ARGV[6]
local size = ARGV[7]
local lock_ttl_ms = ARGV[8]
local created_ms = ARGV[9]
local deadline_ms = ARGV[10]
local retention_ms = ARGV[11]
local version = ARGV[12]
local virtual_min = ARGV[13]
local teams_limit = ARGV[14]
local led_limit = ARGV[15]
local departed = ARGV[16]
local left_members = ARGV[17]
local members_at = 18
-- Returns {OK} rebuilt (its locks are gone: shoppers lock again; a team past its deadline
-- fails on its next call, as any other), {EXISTING} Redis has it (nothing changed).
if redis.call('EXISTS', team_hash) == 1 then
  return {EXISTING}
end
local deadline = tonumber(deadline_ms)
local expire_at = deadline + tonumber(retention_ms)
local members = (#ARGV - members_at + 1) / 2
redis.call('HSET', team_hash, 'leader_id', leader_id, 'leader_order_id', leader_order_id,
           'status', 'open', 'size', size, 'lock_ttl_ms', lock_ttl_ms, 'created_ms', created_ms,
           'deadline_ms', deadline_ms, 'expire_at_ms', int(expire_at), 'member_count', members,
           'version', version, 'virtual_min', virtual_min, 'teams_limit', teams_limit,
           'led_limit', led_limit, 'departed', departed,
           'offer_ttl_ms', redis.call('HGET', activity_hash, 'offer_ttl_ms') or lock_ttl_ms)
-- The members who left keep their memory (a repeated leave answers the same; they take no
-- seat here again).
for item in string.gmatch(left_members, '[^,]+') do
  local parts = split(item)
  redis.call('HSET', team_hash, 'left:' .. parts[1], 'left|' .. parts[2] .. '|' .. parts[3])
end
redis.call('DEL', team_members)
if members > 0 then
  redis.call('HSET', team_members, unpack(ARGV, members_at, #ARGV))
  redis.call('PEXPIREAT', team_members, expire_at)
end
index_deadline(team_id, deadline)
index_seats(named_team())
-- A live team: its activity's counts stay until activity_release (activity_counts_put).
redis.call('PERSIST', A.counts)
redis.call('PEXPIREAT', team_hash, expire_at)
return {OK}
