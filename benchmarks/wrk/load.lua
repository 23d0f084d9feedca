-- The closed-loop load of benchmarks/http_level.py and benchmarks/confirm_mix.py:
-- wrk -s load.lua URL -- MODE KEY ARG... (the modes: docs/benchmarking.md). done() prints
-- "wrk_result", "wrk_status" and (storm, mixed) "wrk_ops op_<op>_<status>" lines.

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local OPS = {"lock", "unlock", "confirm"}
local MIXED_OPS = {"grab", "lock", "confirm"}
local STATUSES = {"200", "201", "404", "409", "410", "4xx", "5xx"}
local NAMES = {"c200", "c201", "c404", "c409", "c410", "c4xx", "c5xx", "cother",
               "grabbed", "already", "unmatched", "switched"}

local mode, headers
local counter = 0
local last_path, last_body
local packets = {}
local activity, n_teams, n_users
local slots = {}          -- storm: slot -> {user=, team= or nil}
local pending = {}        -- storm: request id -> {op, slot, user, team}
local fresh = 0
local confirms = {}       -- mixed: confirms due, sent before the next scheduled request

c200, c201, c404, c409, c410, c4xx, c5xx, cother = 0, 0, 0, 0, 0, 0, 0, 0
grabbed, already, unmatched, switched = 0, 0, 0, 0

local function new_user(slot)
  fresh = fresh + 1
  slots[slot] = {user = "u" .. tid .. "-" .. fresh, team = nil}
end

function init(args)
  mode = args[1]
  load_mode = mode   -- a global: done() runs in the main state, which init() never sees
  headers = {["Authorization"] = "Bearer " .. args[2], ["Content-Type"] = "application/json"}
  math.randomseed(os.time() * 1000 + (tid or 0))
  if mode == "grab" then
    for i = 3, #args do table.insert(packets, args[i]) end
  elseif mode == "lock" then
    activity, n_teams = args[3], tonumber(args[4])
  elseif mode == "storm" then
    n_users, n_teams, activity = tonumber(args[3]), tonumber(args[4]), args[5]
    for slot = 1, n_users do new_user(slot) end
  elseif mode == "mixed" then
    activity, n_activities, n_teams = args[3], tonumber(args[4]), tonumber(args[5])
    for i = 6, #args do table.insert(packets, args[i]) end
  end
end

local function storm_request()
  counter = counter + 1
  local id = tid .. "." .. counter
  headers["X-Request-Id"] = id
  local slot = math.random(n_users)
  local s = slots[slot]
  local team_path = "/v1/activities/" .. activity .. "/teams/"
  local op, method, path, body, team
  local roll = math.random()
  if s.team and roll >= 0.85 then
    op, method, team = "confirm", "POST", s.team
    path = team_path .. team .. "/members"
    body = '{"user_id":"' .. s.user .. '","order_id":"o-' .. s.user .. '"}'
  elseif s.team and roll >= 0.70 then
    op, method, team = "unlock", "DELETE", s.team
    path = team_path .. team .. "/locks/" .. s.user
  else
    op, method, team = "lock", "POST", "t" .. math.random(n_teams)
    path = team_path .. team .. "/locks"
    body = '{"user_id":"' .. s.user .. '"}'
  end
  pending[id] = {op, slot, s.user, team}
  return wrk.format(method, path, headers, body)
end

-- As benchmarks/openloop.py's mixed mode, closed loop: request i a grab by a new user
-- unless i % 3 == 2, a seat lock by a new user; a lock answered 201 is confirmed by the
-- thread's next request (no payment's delay: this measures the rate, not the latency).
local function mixed_request()
  local confirm = table.remove(confirms, 1)
  if confirm then return confirm end
  counter = counter + 1
  local user = "m" .. tid .. "-" .. counter
  local body = '{"user_id":"' .. user .. '"}'
  if counter % 3 ~= 2 then
    headers["X-Request-Id"] = "g." .. tid .. "." .. counter
    local path = "/v1/redpackets/" .. packets[counter % #packets + 1] .. "/grab"
    return wrk.format("POST", path, headers, body)
  end
  local n = math.floor(counter / 3)   -- this thread's n-th lock
  local team = "/v1/activities/" .. activity .. "-" .. (n % n_activities + 1) ..
    "/teams/t" .. (math.floor(n / n_activities) % n_teams + 1)
  local id = "l." .. tid .. "." .. counter
  headers["X-Request-Id"] = id
  pending[id] = {team, user}
  return wrk.format("POST", team .. "/locks", headers, body)
end

function request()
  if mode == "storm" then return storm_request() end
  if mode == "mixed" then return mixed_request() end
  counter = counter + 1
  local user = '{"user_id":"u' .. tid .. '-' .. counter .. '"}'
  if mode == "lock" then
    local team = (counter + tid * 7919) % n_teams + 1
    local path = "/v1/activities/" .. activity .. "/teams/t" .. team .. "/locks"
    return wrk.format("POST", path, headers, user)
  end
  local path, body
  if counter % 20 == 0 and last_path then
    path, body = last_path, last_body   -- a double tap: same user, same packet
  elseif mode == "grab" then
    path, body = "/v1/redpackets/" .. packets[(counter % #packets) + 1] .. "/grab", user
  else
    path, body = "/grab", user
  end
  last_path, last_body = path, body
  return wrk.format("POST", path, headers, body)
end

local function status_name(status)
  if status == 200 or status == 201 or status == 404 or status == 409 or status == 410 then
    return tostring(status)
  end
  return status >= 500 and "5xx" or "4xx"
end

local function storm_response(status, hdrs, body)
  local id = hdrs["x-request-id"] or hdrs["X-Request-Id"]
  local sent = id and pending[id]
  if not sent then
    unmatched = unmatched + 1
    return
  end
  pending[id] = nil
  local op, slot, user, team = sent[1], sent[2], sent[3], sent[4]
  local name = "op_" .. op .. "_" .. status_name(status)
  _G[name] = (_G[name] or 0) + 1
  local s = slots[slot]
  if s.user ~= user then return end   -- the slot moved on to a fresh user meanwhile
  local ok = status == 200 or status == 201
  if op == "lock" then
    if ok then
      s.team = team
      if string.find(body, '"released_team_id":%s*"') then switched = switched + 1 end
    elseif status == 409 then
      s.team = nil
    end
  elseif op == "unlock" then
    if s.team == team then s.team = nil end
  elseif ok then
    new_user(slot)
  elseif status == 409 and s.team == team then
    s.team = nil
  end
end

local function mixed_response(status, hdrs)
  local id = hdrs["x-request-id"] or hdrs["X-Request-Id"] or ""
  local op = ({g = "grab", l = "lock", c = "confirm"})[string.sub(id, 1, 1)]
  if not op then
    unmatched = unmatched + 1
    return
  end
  local name = "op_" .. op .. "_" .. status_name(status)
  _G[name] = (_G[name] or 0) + 1
  local sent = pending[id]
  pending[id] = nil
  if sent and status == 201 then
    local body = '{"user_id":"' .. sent[2] .. '","order_id":"' .. sent[2] .. '"}'
    local h = {["Authorization"] = headers["Authorization"],
               ["Content-Type"] = "application/json", ["X-Request-Id"] = "c" .. string.sub(id, 2)}
    table.insert(confirms, wrk.format("POST", sent[1] .. "/members", h, body))
  end
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
  if mode == "storm" then
    storm_response(status, hdrs, body)
  elseif mode == "mixed" then
    mixed_response(status, hdrs)
  elseif mode == "grab" and status == 200 then
    if string.find(body, '"grabbed"', 1, true) then
      grabbed = grabbed + 1
    elseif string.find(body, '"already_grabbed"', 1, true) then
      already = already + 1
    end
  end
end

local function totals(list)
  local parts = {}
  for _, name in ipairs(list) do
    local n = 0
    for _, thread in ipairs(threads) do n = n + (thread:get(name) or 0) end
    table.insert(parts, string.format("%s=%d", name, n))
  end
  return table.concat(parts, " ")
end

function done(summary, latency, requests)
  local e = summary.errors
  local mode = threads[1] and threads[1]:get("load_mode")
  io.write(string.format(
    "wrk_result requests=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d max_us=%d " ..
    "mean_us=%.1f err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status,
    e.timeout))
  io.write("wrk_status " .. totals(NAMES) .. "\n")
  if mode == "storm" or mode == "mixed" then
    local ops = {}
    for _, op in ipairs(mode == "storm" and OPS or MIXED_OPS) do
      for _, st in ipairs(STATUSES) do table.insert(ops, "op_" .. op .. "_" .. st) end
    end
    io.write("wrk_ops " .. totals(ops) .. "\n")
  end
end
