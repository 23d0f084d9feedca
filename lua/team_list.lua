#!lua flags=allow-oom
-- team_list: a page of the activity's open teams that have a free seat, closest to forming
-- first (the order of team_join), after time is applied where it is due; or, with `full`
-- '1', of its open teams full of members and locks, earliest deadline first (from the
-- deadline index, which lists every open team; the open-seat index lists none that is full).
-- At most page_size + candidates index entries are looked at: a team found past its deadline
-- fails and is left out, so a page may be short while more follow. The cursor
-- (cursor_score, cursor_team_id) is where the previous page ended.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.TEAM_LIST); the first ones are named
-- in _pick_keys.
-- requires: _common
-- requires: _team_codes
-- requires: _pick_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- requires: _team_pick
local page_size = ARGV[10]
local full = ARGV[11]
-- Returns {OK, cursor score or '', cursor team_id or '', {{team_id, team...}, ...}}, where
-- team... is the team as team_read answers it and the cursor ('' '' after the last page) is
-- the one to pass for the next page, or {ACTIVITY_NOT_FOUND} Redis has no copy of the activity.
if redis.call('EXISTS', activity_hash) == 0 then
  return {ACTIVITY_NOT_FOUND}
end
local now = now_ms(shift_ms)
local limit = tonumber(page_size)
apply_time(now, tonumber(candidates))

local index = full == '1' and A.deadlines or A.open_seats
-- Whether an open team (loaded, its expired locks gone) belongs in this page.
local function wanted_team(team)
  if full ~= '1' then
    return true
  end
  return team.member_count + redis.call('ZCARD', team.locks) >= team.size
end

local page, seen = {}, {}
local score, team_id = cursor_score, cursor_team_id
local budget = limit + tonumber(candidates)
while #page < limit and budget > 0 do
  local start = rank_after(index, score, team_id)
  local wanted = math.min(limit - #page, budget)
  local listed = redis.call('ZRANGE', index, start, start + wanted - 1, 'WITHSCORES')
  if #listed == 0 then
    break
  end
  for i = 1, #listed, 2 do
    budget = budget - 1
    team_id, score = listed[i], int(tonumber(listed[i + 1]))
    -- A team whose expired locks go now moves down the index: it may be met again.
    if not seen[team_id] then
      seen[team_id] = true
      local team = load_team(now, team_keys_of(team_id))
      if not team then
        forget_team(team_id)
      elseif team.status == 'open' and wanted_team(team) then
        page[#page + 1] = {team_id, snapshot(team)}
      end
    end
  end
end
if score == '' or redis.call('ZCARD', index) <= rank_after(index, score, team_id) then
  return {OK, '', '', page}
end
return {OK, score, team_id, page}
