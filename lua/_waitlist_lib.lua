-- _waitlist_lib: the waitlist (SPEC §3 "Waitlist", §4.13): every seat freed is offered, in
-- the script that frees it, to the head of the team's line, else of the activity's line.
-- groupbuy/storage/specs.py prepends it right after _team_lib, whose hand_off, hand_units
-- and end_line it defines.
-- Keys (docs/scripts.md): A.waitlist, a hash user -> entry, with the fields '~seq' (the
-- last entry's number) and '~waiting' (entries waiting now); A.line, a zset user -> entry
-- number of those waiting for any team, and A.line .. ':' .. team_id the same for one team;
-- A.waitlist_due, a zset user -> expiry of each waiting entry (what waitlist_expire reads).
-- An entry is 'q|team_id|queued_ms|expires_ms|seq' while it waits ('' team: any team) and
-- 'o|team_id|locked_at_ms|expires_at_ms|version|queued_ms' once offered: the offer stays readable
-- until the offered lock expires, the user confirms it or queues again.

-- Entries a call may drop or expire on its way to a head that takes the seat: the work of
-- a call stays bounded whatever the line holds (the rest go on a later call).
local skips_left = 100

local function team_line(team_id)
  return A.line .. ':' .. team_id
end

-- The line an entry waits in: its team's, or the activity's ('' team).
local function line_of(entry_team)
  if entry_team == '' then
    return A.line
  end
  return team_line(entry_team)
end

-- Keep `key` at least until `at` ms (and a minute more): a waitlist key has an owner that
-- deletes its members, and a TTL in case no sweep ever runs.
local function keep_until(key, at, now)
  if redis.call('PTTL', key) < at - now + 60000 then  -- (-1: no TTL yet)
    redis.call('PEXPIREAT', key, int(at + 60000))
  end
end

-- Take a waiting entry out of its line and the due index; one fewer waits.
local function unqueue(user, parts)
  redis.call('ZREM', line_of(parts[2]), user)
  redis.call('ZREM', A.waitlist_due, user)
  redis.call('HINCRBY', A.waitlist, '~waiting', -1)
end

-- A waiting entry ends without a seat: 'waitlist.expired' (its time ran out) or
-- 'waitlist.dropped' for `reason` (the user cannot take a seat any more).
local function end_entry(user, parts, kind, at, reason)
  unqueue(user, parts)
  redis.call('HDEL', A.waitlist, user)
  local record = {'type', kind, 'at_ms', int(at), 'activity_id', activity_id,
                  'team_id', parts[2], 'user_id', user, 'queued_ms', parts[3], 'seq', parts[5]}
  if reason then
    record[#record + 1] = 'reason'
    record[#record + 1] = reason
  end
  emit(record)
end

-- Why `user` (waiting in line) may not take a seat of `team` now, or nil. Users who became
-- blocked or a member of it, left it, reached the activity's team limit or hold a live lock
-- of the activity are dropped on the way.
local function unfit(team, user, now)
  if redis.call('HEXISTS', A.blocklist, user) == 1 then
    return 'blocked'
  elseif redis.call('HEXISTS', team.members, user) == 1 then
    return 'member'
  elseif has_left(team, user) then
    return 'left'
  elseif over_limit(team, user, 'teams', team.teams_limit, 'teams_per_user') then
    return 'limit'
  end
  local current = redis.call('GET', user_counter(user, 'lock'))
  if current and tonumber(split(current)[3]) > now then
    return 'locked'
  end
  return nil
end

-- The first entry of `line` that may take a seat of `team`, with its entry's parts, or nil;
-- the entries it passes on the way end here (expired, unfit), except those waiting for any
-- team that only this team's seat does not suit (a member of it, or who left it): they stay.
local function head_of(line, team, now)
  local rank = 0
  while skips_left > 0 do
    local head = redis.call('ZRANGE', line, rank, rank)[1]
    if not head then
      return nil
    end
    local entry = redis.call('HGET', A.waitlist, head)
    local parts = entry and split(entry)
    if not parts or parts[1] ~= 'q' then
      redis.call('ZREM', line, head)  -- an entry lost with its hash: nothing to say
    elseif tonumber(parts[4]) <= now then
      end_entry(head, parts, 'waitlist.expired', tonumber(parts[4]))
    else
      local why = unfit(team, head, now)
      if not why then
        return head, parts
      elseif parts[2] == '' and (why == 'member' or why == 'left') then
        rank = rank + 1  -- another team's seat may suit it
      else
        end_entry(head, parts, 'waitlist.dropped', now, why)
      end
    end
    skips_left = skips_left - 1
  end
  return nil
end

-- Whether the activity's stock has no unit left (no cap: never).
local function sold_out(now)
  local stock = tonumber(redis.call('HGET', A.hash, 'stock') or '0')
  return stock > 0 and tonumber(redis.call('HGET', A.counts, 'members') or '0')
    + redis.call('ZCOUNT', A.lock_expiries, '(' .. int(now), '+inf') >= stock
end

-- Give `user` (waiting with `parts`) a seat lock of `team` for the team's offer_ttl_ms:
-- 'lock.offered', and the entry becomes the offer.
local function offer(team, user, parts, now, lock_count)
  unqueue(user, parts)
  local expires, version = take_seat(team, user, now, lock_count, user_counter(user, 'lock'),
                                     team.offer_ttl_ms)
  redis.call('HSET', A.waitlist, user, 'o|' .. team.id .. '|' .. int(now) .. '|' ..
             int(expires) .. '|' .. version .. '|' .. parts[3])
  keep_until(A.waitlist, expires, now)
  emit({'type', 'lock.offered', 'at_ms', int(now), 'activity_id', activity_id,
        'team_id', team.id, 'user_id', user, 'locked_at_ms', int(now),
        'expires_at_ms', int(expires), 'queued_ms', parts[3], 'seq', parts[5],
        'version', version})
end

-- Offer the free seats of `team` (loaded) to its line, then the activity's, while a seat
-- and a unit of the stock are free; returns how many it offered. One EXISTS when nobody
-- waits.
hand_off = function(team)
  local now = team.now
  local own = team_line(team.id)
  if team.status ~= 'open' or redis.call('EXISTS', own, A.line) == 0 then
    return 0
  end
  local given = 0
  while true do
    local lock_count = redis.call('ZCARD', team.locks)
    if team.member_count + lock_count >= team.size or sold_out(now) then
      return given
    end
    local user, parts = head_of(own, team, now)
    if not user then
      user, parts = head_of(A.line, team, now)
    end
    if not user then
      return given
    end
    offer(team, user, parts, now, lock_count)
    given = given + 1
  end
end

-- `units` of the stock came back without a seat of `ended` (a team that failed, a member of
-- a formed team refunded; a stock raised: `ended` only carries `now`): the activity's line
-- takes them in the teams with a free seat. Returns how many it offered.
hand_units = function(ended, units)
  local given = 0
  if units <= 0 or redis.call('EXISTS', A.line) == 0 then
    return given
  end
  for _ = 1, 8 do  -- teams looked at: each one filled leaves the open-seat index
    local first = redis.call('ZRANGE', A.open_seats, 0, 0)[1]
    if not first then
      return given
    end
    local team = load_team(ended.now, team_keys_of(first))
    if not team then
      forget_team(first)
    else
      local offered = hand_off(team)
      given = given + offered
      if offered == 0 and team.status == 'open' then
        return given
      end
    end
  end
  return given
end

-- A team that stops taking seats (formed or failed) ends its line: its entries are dropped
-- ('team_formed', 'team_failed'), up to what one call may do; the rest expire.
end_line = function(team, status)
  local line = team_line(team.id)
  local users = redis.call('ZRANGE', line, 0, skips_left - 1)
  for _, user in ipairs(users) do
    local entry = redis.call('HGET', A.waitlist, user)
    if entry then
      end_entry(user, split(entry), 'waitlist.dropped', team.now or 0, 'team_' .. status)
    else
      redis.call('ZREM', line, user)
    end
  end
  skips_left = skips_left - #users
end

-- Whether anyone waits for a seat of `team` (its line or the activity's). One command.
local function line_waits(team)
  return redis.call('EXISTS', team_line(team.id), A.line) > 0
end

-- Before a lock, a join or a queue takes a free seat of `team` (loaded) while someone waits:
-- the line gets what it can take first (§4.13; the stock may have held the seat back, or the
-- heads waited for other teams). Returns whether a seat is still free for the caller: the
-- line was looked through and no entry could take it (a call that ran out of entries it may
-- look at leaves it to the line).
local function line_first(team)
  hand_off(team)
  return team.member_count + redis.call('ZCARD', team.locks) < team.size and skips_left > 0
end
