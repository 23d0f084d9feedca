-- _team_lib: helpers shared by the team_* scripts (after _common); groupbuy/scripts.py
-- prepends this file to every script whose header says "-- requires: _team_lib".
-- Common KEYS of team scripts (all under the hash tag {a:<activity_id>}):
-- KEYS[1] team hash  KEYS[2] members hash (user -> "seq|joined_at_ms|order_id")
-- KEYS[3] locks zset (member user_id, score locked_at_ms)  KEYS[4] activity outbox stream
-- Common ARGV: ARGV[1] activity_id  ARGV[2] team_id  ARGV[3] clock shift in ms (0 in production)
-- Team hash fields: leader_id, leader_order_id, status (open|formed|failed), size,
-- lock_ttl_ms, created_ms, deadline_ms, expire_at_ms, member_count, formed_ms, failed_ms.

-- Code numbers, mirrored by groupbuy.locks.codes.TeamCode.
local OK, EXISTING, TEAM_FULL, ALREADY_MEMBER, TEAM_FORMED, TEAM_FAILED = 0, 1, 2, 3, 4, 5
local TEAM_NOT_FOUND, ACTIVITY_NOT_FOUND, LOCK_REQUIRED, CONFLICT, SWITCH_NEEDED = 6, 7, 8, 9, 10
local NO_LOCK = 11

-- Append one record for SQL to the activity's outbox; fields is a flat list.
local function emit(fields)
  redis.call('XADD', KEYS[4], '*', unpack(fields))
end

-- Remove the locks that expired at or before `at`, one lock.expired record each.
local function purge_expired(team, at)
  local cutoff = at - team.lock_ttl_ms
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', cutoff, 'WITHSCORES')
  for i = 1, #expired, 2 do
    local locked_at = tonumber(expired[i + 1])
    emit({'type', 'lock.expired', 'at_ms', int(locked_at + team.lock_ttl_ms),
          'activity_id', ARGV[1], 'team_id', ARGV[2], 'user_id', expired[i],
          'locked_at_ms', int(locked_at)})
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', cutoff)
  end
end

-- "user|order,user|order" in joining order, for records that list the members.
local function member_list()
  local flat = redis.call('HGETALL', KEYS[2])
  local rows = {}
  for i = 1, #flat, 2 do
    local parts = split(flat[i + 1])
    rows[#rows + 1] = {tonumber(parts[1]), flat[i] .. '|' .. parts[3]}
  end
  table.sort(rows, function(a, b) return a[1] < b[1] end)
  local out = {}
  for i = 1, #rows do out[i] = rows[i][2] end
  return table.concat(out, ',')
end

-- A team past its deadline fails, in effect at the deadline, whoever notices first.
local function fail_team(team)
  purge_expired(team, team.deadline_ms)
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[1], 'status', 'failed', 'failed_ms', int(team.deadline_ms))
  emit({'type', 'team.failed', 'at_ms', int(team.deadline_ms), 'activity_id', ARGV[1],
        'team_id', ARGV[2], 'members', member_list()})
  team.status = 'failed'
end

-- The team's state after the lazy checks (deadline, expired locks), or nil if unknown.
local function load_team(now)
  local f = redis.call('HMGET', KEYS[1], 'status', 'size', 'lock_ttl_ms', 'deadline_ms',
                       'member_count', 'expire_at_ms')
  if not f[1] then
    return nil
  end
  local team = {status = f[1], size = tonumber(f[2]), lock_ttl_ms = tonumber(f[3]),
                deadline_ms = tonumber(f[4]), member_count = tonumber(f[5]),
                expire_at_ms = tonumber(f[6])}
  if team.status == 'open' then
    if now >= team.deadline_ms then
      fail_team(team)
    else
      purge_expired(team, now)
    end
  end
  return team
end

-- The refusal for a team that takes no more seats (formed or failed), or nil while open.
local function closed_code(team)
  if team.status == 'formed' then
    return TEAM_FORMED
  elseif team.status == 'failed' then
    return TEAM_FAILED
  end
  return nil
end
