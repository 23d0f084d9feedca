#!lua
-- team_restore: rebuild an open team that Redis lost, from its SQL record, once.
-- requires: _common
-- requires: _team_lib
-- KEYS[1..10] as _team_lib
-- ARGV[1..3] as _team_lib  ARGV[4] leader_id  ARGV[5] leader's order_id ('' for none)
-- ARGV[6] size  ARGV[7] lock_ttl_ms  ARGV[8] created_ms  ARGV[9] deadline_ms
-- ARGV[10] retention_ms  ARGV[11] version (after every recorded change, plus this one)
-- ARGV[12] virtual_min  ARGV[13] teams_limit  ARGV[14] led_limit (0: none)
-- ARGV[15..] the recorded members as pairs
-- (user_id, "seq|joined_at_ms|order_id"), the leader among them
-- Returns {OK} rebuilt (its locks are gone: shoppers lock again; a team past its deadline
-- fails on its next call, as any other), {EXISTING} Redis has it (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {EXISTING}
end
local deadline = tonumber(ARGV[9])
local expire_at = deadline + tonumber(ARGV[10])
local members = (#ARGV - 14) / 2
redis.call('HSET', KEYS[1], 'leader_id', ARGV[4], 'leader_order_id', ARGV[5], 'status', 'open',
           'size', ARGV[6], 'lock_ttl_ms', ARGV[7], 'created_ms', ARGV[8],
           'deadline_ms', ARGV[9], 'expire_at_ms', int(expire_at), 'member_count', members,
           'version', ARGV[11], 'virtual_min', ARGV[12], 'teams_limit', ARGV[13],
           'led_limit', ARGV[14])
redis.call('DEL', KEYS[2])
if members > 0 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 15, #ARGV))
  redis.call('PEXPIREAT', KEYS[2], expire_at)
end
index_deadline(ARGV[2], deadline)
index_seats(named_team())
redis.call('PEXPIREAT', KEYS[1], expire_at)
return {OK}
