-- _team_lib: helpers shared by the team_* scripts; groupbuy/storage/specs.py prepends this
-- file to every script whose header says "-- requires: _team_lib", after _common,
-- _team_codes and the file that names the script's KEYS and ARGV: _team_keys (scripts that
-- name a team) or _pick_keys (scripts that pick teams). Both name the activity's keys
-- (activity_outbox ... activity_open_seats), activity_id and user_key_prefix; docs/scripts.md
-- says what each holds.
-- A score in the due indexes only ever moves down here (ZADD LT); the sweep that reads
-- it sets it back to the true earliest entry (activity_reindex) or removes it.
-- Team hash fields: leader_id, leader_order_id, status (open|formed|failed), size,
-- lock_ttl_ms, created_ms, deadline_ms, expire_at_ms, member_count, formed_ms, failed_ms,
-- formed_by, teams_limit and led_limit (the activity's per-user limits, 0: none),
-- virtual_min (0: none; else the virtual completion threshold, copied from
-- the activity), virtual_seats (set when formed by it), version (1 when opened, +1 for every
-- lock, unlock, lock expiry, member, formed and failed; every record carries the version
-- after its change), failed_reason (deadline | dissolved | abandoned, set when failed),
-- departed (members who left while it was open: a new member's seq is member_count +
-- departed), left:<user> ('left|at_ms|order_id' or 'refunded|at_ms|order_id': the memory of
-- a member's leave, team_leave), offer_ttl_ms (the lifetime of a lock the waitlist offers;
-- absent: lock_ttl_ms).

local A = {outbox = activity_outbox, lock_index = activity_lock_index,
           deadlines = activity_deadlines, pending = activity_pending,
           due_locks = activity_due_locks, due_deadlines = activity_due_deadlines,
           open_seats = activity_open_seats, counts = activity_counts,
           lock_expiries = activity_lock_expiries, hash = activity_hash,
           blocklist = activity_blocklist, waitlist = activity_waitlist, line = activity_line,
           waitlist_due = activity_waitlist_due}

-- The waitlist's hand-offs (lua/_waitlist_lib.lua, which every script requiring this file
-- requires right after it): what frees a seat here offers it to the head of a line.
local hand_off, hand_units, end_line

-- Extended locks (team_extend). A lock's score in the team's locks zset is its expiry minus
-- the team's lock_ttl_ms: locked_at for a lock never extended, later for one extended. So
-- every `score + lock_ttl_ms` (purge_expired, reindex, the lock index and its due index,
-- next_unlock_at, a switch, the answers) is the lock's true expiry, and ZRANGE lists the
-- locks by expiry. The true locked_at of an extended lock is the team hash field
-- locked_at:<user> (held_since reads it), deleted with the lock (drop_held); the field
-- `extended` ('1' once a lock of the team was extended) lets a team that never had one pay
-- nothing for this. The activity's lock-expiry zset and the user's current-lock key carry
-- the new expiry too.

-- The activity's live counts, kept here in the call that changes them (docs/scripts.md,
-- activity_counts): `by` added to one counter of the counts hash.
local function tally(field, by)
  redis.call('HINCRBY', A.counts, field, by)
end

-- A lock's entry in the activity's lock-expiry zset (score: expiry ms).
local function expiry_entry(team_id, user)
  return team_id .. '|' .. user
end

-- The true locked_at of `user`'s lock scored `score` in a loaded team's locks zset.
local function held_since(team, user, score)
  if team.extended then
    return tonumber(redis.call('HGET', team.hash, 'locked_at:' .. user) or score)
  end
  return score
end

-- Forget the locked_at of the extended locks of `users` (a list) once they are gone.
local function drop_held(team, users)
  if team.extended and #users > 0 then
    local fields = {}
    for i, user in ipairs(users) do fields[i] = 'locked_at:' .. user end
    redis.call('HDEL', team.hash, unpack(fields))
  end
end

-- Append one record for SQL to the activity's outbox; fields is a flat list. The pending
-- index lists the activity from its first waiting record (the entry id's ms) until
-- outbox_ack leaves the stream empty.
local function emit(fields)
  local id = redis.call('XADD', A.outbox, '*', unpack(fields))
  redis.call('ZADD', A.pending, 'NX', string.match(id, '^%d+'), activity_id)
end

-- The counters behind an activity's per-user limits, under its hash tag: `what` is 'teams'
-- (teams the user belongs to, open or formed) or 'led' (open teams the user leads). A team
-- that ends changes the counters of members its caller cannot name, so the names are built
-- here from user_key_prefix (Keys.user_key_prefix); they stay in the activity's slot.
local function user_counter(user, what)
  return user_key_prefix .. user .. ':' .. what
end

-- {USER_LIMIT_REACHED, limit, current, name} when the user is at `limit` (0: none).
local function over_limit(team, user, what, limit, name)
  if limit > 0 then
    local current = tonumber(redis.call('GET', user_counter(user, what)) or '0')
    if current >= limit then
      return {USER_LIMIT_REACHED, limit, current, name}
    end
  end
  return nil
end

-- Move a user's counter by `by` when the activity limits it.
local function count(team, user, what, limit, by)
  if limit > 0 then
    redis.call('INCRBY', user_counter(user, what), by)
  end
end

-- A team that ends is no longer open for its leader; a failed one gives every member
-- their team back.
local function ended_counts(team, failed)
  if team.led_limit > 0 then
    count(team, redis.call('HGET', team.hash, 'leader_id'), 'led', team.led_limit, -1)
  end
  if failed and team.teams_limit > 0 then
    for _, user in ipairs(redis.call('HKEYS', team.members)) do
      count(team, user, 'teams', team.teams_limit, -1)
    end
  end
end

-- Count one change of the team whose hash is `key`; returns its version after it.
local function bump(key)
  return redis.call('HINCRBY', key, 'version', 1)
end

-- Index a team in the lock index at `due` (ms); the activity is due no later than that.
local function index_lock(team_id, due)
  redis.call('ZADD', A.lock_index, int(due), team_id)
  redis.call('ZADD', A.due_locks, 'LT', int(due), activity_id)
end

-- Index an open team in the deadline index; the activity is due no later than that.
local function index_deadline(team_id, deadline)
  redis.call('ZADD', A.deadlines, int(deadline), team_id)
  redis.call('ZADD', A.due_deadlines, 'LT', int(deadline), activity_id)
end

-- Keep a team's entry in the lock index equal to its earliest lock's expiry.
local function reindex(team_id, locks_key, lock_ttl_ms)
  local first = redis.call('ZRANGE', locks_key, 0, 0, 'WITHSCORES')
  if first[2] then
    index_lock(team_id, tonumber(first[2]) + lock_ttl_ms)
  else
    redis.call('ZREM', A.lock_index, team_id)
  end
end

-- Seats taken (members + locks) weigh more than any created_ms (< 2^42 ms, year 2109), and
-- at most 50 are taken: the score stays an integer that a double holds exactly (< 2^53).
local SEAT_WEIGHT = 4398046511104

-- Keep a team's entry in the open-seat index true: listed while it is open with a free seat,
-- scored created_ms - taken * 2^42 (groupbuy.locks.codec.seat_score) so that ZRANGE lists
-- the most taken seats first, then the oldest team. `team` needs id, hash and locks.
local function index_seats(team)
  local f = redis.call('HMGET', team.hash, 'status', 'size', 'member_count', 'created_ms')
  if f[1] == 'open' then
    local taken = tonumber(f[3]) + redis.call('ZCARD', team.locks)
    if taken < tonumber(f[2]) then
      redis.call('ZADD', A.open_seats, int(tonumber(f[4]) - taken * SEAT_WEIGHT), team.id)
      return
    end
  end
  redis.call('ZREM', A.open_seats, team.id)
end

-- A team Redis no longer has (its keys expired or were lost) leaves the activity's indexes.
local function forget_team(team_id)
  redis.call('ZREM', A.lock_index, team_id)
  redis.call('ZREM', A.deadlines, team_id)
  redis.call('ZREM', A.open_seats, team_id)
end

-- A team that stops taking seats leaves every index and drops its locks (and their entries
-- in the activity's lock-expiry zset: at most `size` of them); returns how many it dropped.
local function close_team(team, status, at_field, at)
  local users = redis.call('ZRANGE', team.locks, 0, -1)
  for _, user in ipairs(users) do
    redis.call('ZREM', A.lock_expiries, expiry_entry(team.id, user))
  end
  drop_held(team, users)
  redis.call('DEL', team.locks)
  forget_team(team.id)
  redis.call('HSET', team.hash, 'status', status, at_field, int(at))
  end_line(team, status)
  return #users
end

-- Remove the locks that expired at or before `at`, one lock.expired record each;
-- returns how many.
local function purge_expired(team, at)
  local cutoff = at - team.lock_ttl_ms
  local expired = redis.call('ZRANGEBYSCORE', team.locks, '-inf', cutoff, 'WITHSCORES')
  local users = {}
  for i = 1, #expired, 2 do
    local score = tonumber(expired[i + 1])
    emit({'type', 'lock.expired', 'at_ms', int(score + team.lock_ttl_ms),
          'activity_id', activity_id, 'team_id', team.id, 'user_id', expired[i],
          'locked_at_ms', int(held_since(team, expired[i], score)), 'version', bump(team.hash)})
    redis.call('ZREM', A.lock_expiries, expiry_entry(team.id, expired[i]))
    users[#users + 1] = expired[i]
  end
  if #expired > 0 then
    drop_held(team, users)
    redis.call('ZREMRANGEBYSCORE', team.locks, '-inf', cutoff)
    reindex(team.id, team.locks, team.lock_ttl_ms)
    index_seats(team)
  end
  return #expired / 2
end

-- "user|order,user|order" in joining order, for records that list the members.
local function member_list(team)
  local flat = redis.call('HGETALL', team.members)
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

-- An open team fails at `at` for `reason` (deadline | dissolved | abandoned): its members
-- (the refund list of its team.failed record) give their units and teams back. Before its
-- deadline, the users whose live locks it drops lose their current-lock key too (at the
-- deadline the key ends by itself: it carries the deadline).
local function fail_team(team, at, reason)
  if at < team.deadline_ms then
    for _, user in ipairs(redis.call('ZRANGE', team.locks, 0, -1)) do
      local key = user_counter(user, 'lock')
      local current = redis.call('GET', key)
      if current and split(current)[1] == team.id then
        redis.call('DEL', key)
      end
    end
  end
  ended_counts(team, true)
  tally('teams_open', -1)
  tally('teams_failed', 1)
  if team.member_count > 0 then  -- (Redis refuses the '-0' Lua writes for -0)
    tally('members', -team.member_count)
  end
  local units = team.member_count + close_team(team, 'failed', 'failed_ms', at)
  redis.call('HSET', team.hash, 'failed_reason', reason)
  emit({'type', 'team.failed', 'at_ms', int(at), 'activity_id', activity_id,
        'team_id', team.id, 'members', member_list(team), 'reason', reason,
        'version', bump(team.hash)})
  team.status = 'failed'
  team.ended_now = true
  hand_units(team, units)  -- its members' and locks' units are free for the activity's line
end

-- A team past its deadline ends, in effect at the deadline, whoever notices first: formed
-- by virtual completion when it has at least virtual_min real members, else failed.
local function end_at_deadline(team)
  team.expired_locks = purge_expired(team, team.deadline_ms)
  if team.virtual_min > 0 and team.member_count >= team.virtual_min then
    local seats = team.size - team.member_count
    ended_counts(team, false)
    tally('teams_open', -1)
    tally('teams_formed', 1)
    tally('virtual_completions', 1)
    close_team(team, 'formed', 'formed_ms', team.deadline_ms)
    redis.call('HSET', team.hash, 'virtual_seats', seats)
    emit({'type', 'team.formed', 'at_ms', int(team.deadline_ms), 'activity_id', activity_id,
          'team_id', team.id, 'members', member_list(team), 'virtual_seats', seats,
          'version', bump(team.hash)})
    team.status = 'formed'
    team.ended_now = true
    return
  end
  fail_team(team, team.deadline_ms, 'deadline')
end

-- The team after the lazy checks (deadline, expired locks): `team` (id and keys) with its
-- state added, or nil if Redis does not have it.
local function load_team(now, team)
  local f = redis.call('HMGET', team.hash, 'status', 'size', 'lock_ttl_ms', 'deadline_ms',
                       'member_count', 'expire_at_ms', 'virtual_min', 'teams_limit',
                       'led_limit', 'departed', 'extended', 'offer_ttl_ms')
  if not f[1] then
    return nil
  end
  team.status, team.size, team.lock_ttl_ms = f[1], tonumber(f[2]), tonumber(f[3])
  team.deadline_ms, team.member_count = tonumber(f[4]), tonumber(f[5])
  team.expire_at_ms, team.virtual_min = tonumber(f[6]), tonumber(f[7] or '0')
  team.teams_limit, team.led_limit = tonumber(f[8] or '0'), tonumber(f[9] or '0')
  team.departed = tonumber(f[10] or '0')
  team.extended = f[11] == '1'
  team.offer_ttl_ms = tonumber(f[12] or f[3])
  team.now = now
  team.expired_locks = 0
  if team.status == 'open' then
    if now >= team.deadline_ms then
      end_at_deadline(team)
    else
      team.expired_locks = purge_expired(team, now)
      if team.expired_locks > 0 then
        hand_off(team)
      end
    end
  end
  return team
end

-- Whether `user` left this (loaded) team: a member who left takes no seat in it again.
-- Costs a command only on a team someone left.
local function has_left(team, user)
  return team.departed > 0 and redis.call('HEXISTS', team.hash, 'left:' .. user) == 1
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

-- Why `user` may take no seat of the loaded `team` (a member of it, left it, it formed or
-- failed), or nil.
local function seat_refusal(team, user)
  if redis.call('HEXISTS', team.members, user) == 1 then
    return ALREADY_MEMBER
  elseif has_left(team, user) then
    return LEFT_TEAM
  end
  return closed_code(team)
end

-- Hold a free seat of an open team (loaded, `lock_count` locks now) for `user` from `now`
-- for `ttl` ms (absent: the team's lock_ttl_ms), and point the
-- user's current-lock key at it; returns when the lock expires and the team's version after
-- the lock. A lock of another lifetime (a waitlist's offer) is kept as an extended one.
local function take_seat(team, user, now, lock_count, user_key, ttl)
  local expires = now + (ttl or team.lock_ttl_ms)
  if expires ~= now + team.lock_ttl_ms then
    redis.call('HSET', team.hash, 'locked_at:' .. user, int(now), 'extended', '1')
    team.extended = true
  end
  redis.call('ZADD', team.locks, int(expires - team.lock_ttl_ms), user)
  redis.call('ZADD', A.lock_expiries, int(expires), expiry_entry(team.id, user))
  if lock_count == 0 then
    -- The first lock: it is the earliest (the index learns its expiry) and it creates the
    -- zset (which ends with the team). A later lock is never the earliest (`now` only
    -- grows) unless a lock was extended.
    index_lock(team.id, expires)
    redis.call('PEXPIREAT', team.locks, team.expire_at_ms)
  elseif team.extended then
    -- An extended lock may expire after this one: the index takes the earlier expiry.
    redis.call('ZADD', A.lock_index, 'LT', int(expires), team.id)
    redis.call('ZADD', A.due_locks, 'LT', int(expires), activity_id)
  end
  index_seats(team)
  redis.call('SET', user_key, team.id .. '|' .. int(now) .. '|' .. int(expires) .. '|' ..
             int(team.deadline_ms), 'PX', int(expires - now))
  return expires, bump(team.hash)
end

-- The team as team_read answers it (three flat lists: the team hash, the members hash,
-- the locks oldest first with their scores); put last in a reply table, all three follow.
local function snapshot(team)
  return redis.call('HGETALL', team.hash), redis.call('HGETALL', team.members),
         redis.call('ZRANGE', team.locks, 0, -1, 'WITHSCORES')
end
