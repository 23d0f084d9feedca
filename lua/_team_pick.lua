-- _team_pick: helpers of the scripts that choose among an activity's teams instead of being
-- named one (team_join, team_list); groupbuy/storage/specs.py prepends it after _team_lib.
-- Such a script cannot know before it runs which teams it will read, so it builds their keys
-- here, from team_key_prefix, members_suffix and locks_suffix (_pick_keys).
-- Every key built so carries the activity's hash tag {a:<activity_id>}, as every key in KEYS
-- does: a call still touches one slot in Redis Cluster. With the per-user limit counters of
-- _team_lib, these are the exceptions to "a script touches only KEYS" (docs/architecture.md,
-- "Joining any team").

-- Apply time where it is due, up to `looks` teams from each index: the lock index lists the
-- teams by their earliest lock's expiry, so the teams holding an expired lock come first
-- (full ones too: a seat freed that way is free, swept or not), and the deadline index lists
-- the open teams by deadline. Afterwards no entry looked at is due any more (an entry that
-- was wrong is put right), so a next call goes further. Returns true when a pass was cut
-- short: more may be due.
local function apply_time(now, looks)
  local cut = false
  for _, index in ipairs({A.lock_index, A.deadlines}) do
    local due = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, looks)
    for _, team_id in ipairs(due) do
      local team = load_team(now, team_keys_of(team_id))
      if team and team.status == 'open' then
        reindex(team.id, team.locks, team.lock_ttl_ms)
      else
        forget_team(team_id)
      end
    end
    cut = cut or #due == looks
  end
  return cut
end

-- Whether string a sorts before b byte by byte, as Redis orders the members of one score
-- (Lua's `<` follows the server's locale).
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- The rank in `index` (the open-seat index or the deadline index) of the first entry after
-- (score, team_id) in its order, whether or not that entry is still there (0 for no cursor).
local function rank_after(index, score, team_id)
  if score == '' then
    return 0
  end
  local now_score = redis.call('ZSCORE', index, team_id)
  if now_score and tonumber(now_score) == tonumber(score) then
    return redis.call('ZRANK', index, team_id) + 1
  end
  -- The entries of this score hold ranks [low, high), their ids in byte order.
  local low = redis.call('ZCOUNT', index, '-inf', '(' .. score)
  local high = low + redis.call('ZCOUNT', index, score, score)
  while low < high do
    local mid = math.floor((low + high) / 2)
    if bytes_before(team_id, redis.call('ZRANGE', index, mid, mid)[1]) then
      high = mid
    else
      low = mid + 1
    end
  end
  return low
end
