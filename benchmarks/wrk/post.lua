-- POST load for benchmarks/http_level.py.
-- wrk -s post.lua URL -- MODE KEY ARG...
--   grab  KEY PACKET_ID...   POST /v1/redpackets/<id>/grab, distinct users round-robin over
--                            the packets; every 20th request repeats the previous one
--   lock  KEY ACTIVITY TEAMS POST /v1/activities/<a>/teams/t<k>/locks, a new user per request,
--                            round-robin over teams t1..tTEAMS (no repeats)
--   bare  KEY                POST /grab {"user_id": ...} (benchmarks/bare_app.py)
-- done() prints "wrk_result key=value ..." lines that http_level.py parses.

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local mode, key, params
local counter = 0
local last_path, last_body
local packets = {}
local activity, n_teams

c200, c201, c404, c409, c410, c4xx, c5xx, cother, grabbed, already = 0, 0, 0, 0, 0, 0, 0, 0, 0, 0

function init(args)
  mode = args[1]
  key = args[2]
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. key
  if mode == "grab" then
    for i = 3, #args do table.insert(packets, args[i]) end
  elseif mode == "lock" then
    activity, n_teams = args[3], tonumber(args[4])
  end
  math.randomseed(os.time() * 1000 + (tid or 0))
end

function request()
  counter = counter + 1
  local path, body
  if mode == "lock" then
    local team = (counter + tid * 7919) % n_teams + 1
    path = "/v1/activities/" .. activity .. "/teams/t" .. team .. "/locks"
    return wrk.format(nil, path, nil, '{"user_id":"u' .. tid .. '-' .. counter .. '"}')
  end
  if counter % 20 == 0 and last_path then
    path, body = last_path, last_body   -- a double tap: same user, same packet
  else
    local user = '{"user_id":"u' .. tid .. '-' .. counter .. '"}'
    if mode == "grab" then
      path = "/v1/redpackets/" .. packets[(counter % #packets) + 1] .. "/grab"
    else
      path = "/grab"
    end
    body = user
  end
  last_path, last_body = path, body
  return wrk.format(nil, path, nil, body)
end

function response(status, headers, body)
  if status == 200 then
    c200 = c200 + 1
    if mode == "grab" then
      if string.find(body, '"grabbed"', 1, true) then
        grabbed = grabbed + 1
      elseif string.find(body, '"already_grabbed"', 1, true) then
        already = already + 1
      end
    end
  elseif status == 201 then c201 = c201 + 1
  elseif status == 404 then c404 = c404 + 1
  elseif status == 409 then c409 = c409 + 1
  elseif status == 410 then c410 = c410 + 1
  elseif status >= 500 then c5xx = c5xx + 1
  elseif status >= 400 then c4xx = c4xx + 1
  else cother = cother + 1
  end
end

function done(summary, latency, requests)
  local names = {"c200", "c201", "c404", "c409", "c410", "c4xx", "c5xx", "cother",
                 "grabbed", "already"}
  local totals = {}
  for _, name in ipairs(names) do totals[name] = 0 end
  for _, thread in ipairs(threads) do
    for _, name in ipairs(names) do
      totals[name] = totals[name] + (thread:get(name) or 0)
    end
  end
  local e = summary.errors
  io.write(string.format(
    "wrk_result requests=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d max_us=%d " ..
    "mean_us=%.1f err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status,
    e.timeout))
  local parts = {}
  for _, name in ipairs(names) do
    table.insert(parts, string.format("%s=%d", name, totals[name]))
  end
  io.write("wrk_status " .. table.concat(parts, " ") .. "\n")
end
