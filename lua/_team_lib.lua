-- _team_lib: helpers shared by the team_* scripts (after _common); groupbuy/storage/scripts.py
-- prepends this file to every script whose header says "-- requires: _team_lib".
-- Common KEYS of team scripts (all under the hash tag {a:<activity_id>}):
-- KEYS[1] team hash  KEYS[2] members hash (user -> "seq|joined_at_ms|order_id")
-- KEYS[3] locks zset (member user_id, score locked_at_ms)  KEYS[4] activity outbox stream
-- KEYS[5] activity's lock index (zset team_id -> when its earliest lock expires, ms)
-- KEYS[6] activity's deadline index (zset team_id -> deadline ms, open teams only)
-- The two indexes let the sweeps find due teams without scanning the keyspace.
-- Global indexes (no hash tag; docs/architecture.md says how they map in Redis Cluster):
-- KEYS[7] pending index (zset activity_id -> ms of the oldest record waiting in its outbox)
-- KEYS[8] lock-due index (zset activity_id -> at most the lowest score of its KEYS[5])
-- KEYS[9] deadline-due index (zset activity_id -> at most the lowest score of its KEYS[6])
-- A score in KEYS[8] / KEYS[9] only ever moves down here (ZADD LT); the sweep that reads
-- it sets it back to the true earliest entry (activity_reindex) or removes it.
-- Common ARGV: ARGV[1] activity_id  ARGV[2] team_id  ARGV[3] clock shift in ms (0 in production)
-- Team hash fields: leader_id, leader_order_id, status (open|formed|failed), size,
-- lock_ttl_ms, created_ms, deadline_ms, expire_at_ms, member_count, formed_ms, failed_ms,
-- formed_by, teams_limit and led_limit (the activity's per-user limits, 0: none),
-- virtual_min (0: none; else the virtual completion threshold, copied from
-- the activity), virtual_seats (set when formed by it), version (1 when opened, +1 for every lock, unlock, lock expiry, member,
-- formed and failed; every record carries the version after its change).

-- Code numbers, mirrored by groupbuy.locks.codes.TeamCode.
local OK, EXISTING, TEAM_FULL, ALREADY_MEMBER, TEAM_FORMED, TEAM_FAILED = 0, 1, 2, 3, 4, 5
local TEAM_NOT_FOUND, ACTIVITY_NOT_FOUND, LOCK_REQUIRED, CONFLICT, SWITCH_NEEDED = 6, 7, 8, 9, 10
local NO_LOCK = 11
local USER_LIMIT_REACHED = 14

-- Append one record for SQL to the activity's outbox; fields is a flat list. The pending
-- index lists the activity from its first waiting record (the entry id's ms) until
-- outbox_ack leaves the stream empty.
local function emit(fields)
  local id = redis.call('XADD', KEYS[4], '*', unpack(fields))
  redis.call('ZADD', KEYS[7], 'NX', string.match(id, '^%d+'), ARGV[1])
end

-- The counters behind an activity's per-user limits, under its hash tag: `what` is 'teams'
-- (teams the user belongs to, open or formed) or 'led' (open teams the user leads). The
-- names are built here from KEYS[1] (the team hash, '<tag>:team:<team id>') because a team
-- that ends changes the counters of members its caller cannot name; they stay in the
-- activity's slot. groupbuy.storage.keys.Keys.user_counter builds the same names.
local function user_counter(user, what)
  return string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[2] - 6) .. ':user:' .. user .. ':' .. what
end

-- {USER_LIMIT_REACHED, limit, current, name} when the user is at `limit` (0: none).
local function over_limit(user, what, limit, name)
  if limit > 0 then
    local current = tonumber(redis.call('GET', user_counter(user, what)) or '0')
    if current >= limit then
      return {USER_LIMIT_REACHED, limit, current, name}
    end
  end
  return nil
end

-- Move a user's counter by `by` when the activity limits it.
local function count(user, what, limit, by)
  if limit > 0 then
    redis.call('INCRBY', user_counter(user, what), by)
  end
end

-- A team that ends is no longer open for its leader; a failed one gives every member
-- their team back.
local function ended_counts(team, failed)
  if team.led_limit > 0 then
    count(redis.call('HGET', KEYS[1], 'leader_id'), 'led', team.led_limit, -1)
  end
  if failed and team.teams_limit > 0 then
    for _, user in ipairs(redis.call('HKEYS', KEYS[2])) do
      count(user, 'teams', team.teams_limit, -1)
    end
  end
end

-- Count one change of the team whose hash is `key`; returns its version after it.
local function bump(key)
  return redis.call('HINCRBY', key, 'version', 1)
end

-- Index a team in the lock index at `due` (ms); the activity is due no later than that.
local function index_lock(team_id, due)
  redis.call('ZADD', KEYS[5], int(due), team_id)
  redis.call('ZADD', KEYS[8], 'LT', int(due), ARGV[1])
end

-- Index an open team in the deadline index; the activity is due no later than that.
local function index_deadline(team_id, deadline)
  redis.call('ZADD', KEYS[6], int(deadline), team_id)
  redis.call('ZADD', KEYS[9], 'LT', int(deadline), ARGV[1])
end

-- Keep a team's entry in the lock index equal to its earliest lock's expiry.
local function reindex(team_id, locks_key, lock_ttl_ms)
  local first = redis.call('ZRANGE', locks_key, 0, 0, 'WITHSCORES')
  if first[2] then
    index_lock(team_id, tonumber(first[2]) + lock_ttl_ms)
  else
    redis.call('ZREM', KEYS[5], team_id)
  end
end

-- A team that stops taking seats leaves both indexes and drops its locks.
local function close_team(status, at_field, at)
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[5], ARGV[2])
  redis.call('ZREM', KEYS[6], ARGV[2])
  redis.call('HSET', KEYS[1], 'status', status, at_field, int(at))
end

-- Remove the locks that expired at or before `at`, one lock.expired record each;
-- returns how many.
local function purge_expired(team, at)
  local cutoff = at - team.lock_ttl_ms
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', cutoff, 'WITHSCORES')
  for i = 1, #expired, 2 do
    local locked_at = tonumber(expired[i + 1])
    emit({'type', 'lock.expired', 'at_ms', int(locked_at + team.lock_ttl_ms),
          'activity_id', ARGV[1], 'team_id', ARGV[2], 'user_id', expired[i],
          'locked_at_ms', int(locked_at), 'version', bump(KEYS[1])})
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', cutoff)
    reindex(ARGV[2], KEYS[3], team.lock_ttl_ms)
  end
  return #expired / 2
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

-- A team past its deadline ends, in effect at the deadline, whoever notices first: formed
-- by virtual completion when it has at least virtual_min real members, else failed.
local function end_at_deadline(team)
  team.expired_locks = purge_expired(team, team.deadline_ms)
  if team.virtual_min > 0 and team.member_count >= team.virtual_min then
    local seats = team.size - team.member_count
    ended_counts(team, false)
    close_team('formed', 'formed_ms', team.deadline_ms)
    redis.call('HSET', KEYS[1], 'virtual_seats', seats)
    emit({'type', 'team.formed', 'at_ms', int(team.deadline_ms), 'activity_id', ARGV[1],
          'team_id', ARGV[2], 'members', member_list(), 'virtual_seats', seats,
          'version', bump(KEYS[1])})
    team.status = 'formed'
    team.ended_now = true
    return
  end
  ended_counts(team, true)
  close_team('failed', 'failed_ms', team.deadline_ms)
  emit({'type', 'team.failed', 'at_ms', int(team.deadline_ms), 'activity_id', ARGV[1],
        'team_id', ARGV[2], 'members', member_list(), 'version', bump(KEYS[1])})
  team.status = 'failed'
  team.ended_now = true
end

-- The team's state after the lazy checks (deadline, expired locks), or nil if unknown.
local function load_team(now)
  local f = redis.call('HMGET', KEYS[1], 'status', 'size', 'lock_ttl_ms', 'deadline_ms',
                       'member_count', 'expire_at_ms', 'virtual_min', 'teams_limit',
                       'led_limit')
  if not f[1] then
    return nil
  end
  local team = {status = f[1], size = tonumber(f[2]), lock_ttl_ms = tonumber(f[3]),
                deadline_ms = tonumber(f[4]), member_count = tonumber(f[5]),
                expire_at_ms = tonumber(f[6]), virtual_min = tonumber(f[7] or '0'),
                teams_limit = tonumber(f[8] or '0'), led_limit = tonumber(f[9] or '0')}
  team.expired_locks = 0
  if team.status == 'open' then
    if now >= team.deadline_ms then
      end_at_deadline(team)
    else
      team.expired_locks = purge_expired(team, now)
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

-- The team as team_read answers it (three flat lists: the team hash, the members hash,
-- the locks oldest first with their scores); put last in a reply table, all three follow.
local function snapshot()
  return redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
         redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
end
