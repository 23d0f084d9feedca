-- Lock storm for benchmarks/http_level.py.
-- wrk -s storm.lua URL -- storm KEY USERS TEAMS ACTIVITY...
--
-- Each thread keeps USERS user slots ("u<thread>-<n>"), each with a home activity (random
-- among ACTIVITY...) and the team whose seat the user last locked. One storm step picks a
-- random slot and
--   70 % (always when the user holds nothing)  POST .../teams/t<rand>/locks {"user_id"}
--   15 %  DELETE .../teams/<held>/locks/<user>
--   15 %  POST .../teams/<held>/members {"user_id", "order_id"}
-- (a lock elsewhere while holding one is the service's switch).
-- wrk keeps several connections per thread and response() does not say which request it
-- answers, so every request carries X-Request-Id "<thread>.<seq>", echoed by the service,
-- and response() looks up what was sent. State updates: lock 200/201 -> remember the team;
-- lock 409, unlock, confirm 409 -> forget it; confirm 200/201 -> the user is a member now,
-- the slot gets a fresh user. A lock answer naming a released_team_id counts as a switch.
-- done() prints the same "wrk_result"/"wrk_status" lines as post.lua plus
-- "wrk_ops op_<operation>_<status>=n ..." (status 200/201/404/409/410/4xx/5xx).

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local OPS = {"lock", "unlock", "confirm"}
local STATUSES = {"200", "201", "404", "409", "410", "4xx", "5xx"}

local n_users, n_teams
local activities = {}
local slots = {}          -- slot -> {user=, activity=, team= or nil}
local pending = {}        -- request id -> {op, slot, user, team}
local fresh = 0           -- users created by this thread
local seq = 0
local headers

c200, c201, c404, c409, c410, c4xx, c5xx, cother = 0, 0, 0, 0, 0, 0, 0, 0
unmatched, switched = 0, 0

local function new_user(slot)
  fresh = fresh + 1
  slots[slot] = {
    user = "u" .. tid .. "-" .. fresh,
    activity = activities[math.random(#activities)],
    team = nil,
  }
end

function init(args)
  headers = {
    ["Authorization"] = "Bearer " .. args[2],
    ["Content-Type"] = "application/json",
  }
  n_users = tonumber(args[3])
  n_teams = tonumber(args[4])
  for i = 5, #args do table.insert(activities, args[i]) end
  math.randomseed(os.time() * 1000 + (tid or 0))
  for slot = 1, n_users do new_user(slot) end
end

local function team_path(s, team)
  return "/v1/activities/" .. s.activity .. "/teams/" .. team
end

function request()
  seq = seq + 1
  local id = tid .. "." .. seq
  headers["X-Request-Id"] = id
  local slot = math.random(n_users)
  local s = slots[slot]
  local op, method, path, body, team
  local roll = math.random()
  if s.team and roll >= 0.85 then
    op, method, team = "confirm", "POST", s.team
    path = team_path(s, team) .. "/members"
    body = '{"user_id":"' .. s.user .. '","order_id":"o-' .. s.user .. '"}'
  elseif s.team and roll >= 0.70 then
    op, method, team = "unlock", "DELETE", s.team
    path = team_path(s, team) .. "/locks/" .. s.user
  else
    op, method, team = "lock", "POST", "t" .. math.random(n_teams)
    path = team_path(s, team) .. "/locks"
    body = '{"user_id":"' .. s.user .. '"}'
  end
  pending[id] = {op, slot, s.user, team}
  return wrk.format(method, path, headers, body)
end

local function count(op, status)
  local name
  if status == 200 or status == 201 or status == 404 or status == 409 or status == 410 then
    name = tostring(status)
  elseif status >= 500 then
    name = "5xx"
  else
    name = "4xx"
  end
  name = "op_" .. op .. "_" .. name
  _G[name] = (_G[name] or 0) + 1
end

function response(status, hdrs, body)
  if status == 200 then c200 = c200 + 1
  elseif status == 201 then c201 = c201 + 1
  elseif status == 404 then c404 = c404 + 1
  elseif status == 409 then c409 = c409 + 1
  elseif status == 410 then c410 = c410 + 1
  elseif status >= 500 then c5xx = c5xx + 1
  elseif status >= 400 then c4xx = c4xx + 1
  else cother = cother + 1
  end
  local id = hdrs["x-request-id"] or hdrs["X-Request-Id"]
  local sent = id and pending[id]
  if not sent then
    unmatched = unmatched + 1
    return
  end
  pending[id] = nil
  local op, slot, user, team = sent[1], sent[2], sent[3], sent[4]
  count(op, status)
  local s = slots[slot]
  if s.user ~= user then return end   -- the slot moved on to a fresh user meanwhile
  if op == "lock" then
    if status == 200 or status == 201 then
      s.team = team
      if string.find(body, '"released_team_id":%s*"') then switched = switched + 1 end
    elseif status == 409 then
      s.team = nil
    end
  elseif op == "unlock" then
    if s.team == team then s.team = nil end
  elseif op == "confirm" then
    if status == 200 or status == 201 then
      new_user(slot)
    elseif status == 409 and s.team == team then
      s.team = nil
    end
  end
end

function done(summary, latency, requests)
  local names = {"c200", "c201", "c404", "c409", "c410", "c4xx", "c5xx", "cother",
                 "unmatched", "switched"}
  local ops = {}
  for _, op in ipairs(OPS) do
    for _, st in ipairs(STATUSES) do table.insert(ops, "op_" .. op .. "_" .. st) end
  end
  local function total(list)
    local parts = {}
    for _, name in ipairs(list) do
      local n = 0
      for _, thread in ipairs(threads) do n = n + (thread:get(name) or 0) end
      table.insert(parts, string.format("%s=%d", name, n))
    end
    return table.concat(parts, " ")
  end
  local e = summary.errors
  io.write(string.format(
    "wrk_result requests=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d max_us=%d " ..
    "mean_us=%.1f err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status,
    e.timeout))
  io.write("wrk_status " .. total(names) .. "\n")
  io.write("wrk_ops " .. total(ops) .. "\n")
end
