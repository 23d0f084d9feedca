-- _common: helpers for every script; groupbuy/storage/specs.py prepends this file to each
-- script whose header says "-- requires: _common" (before any other library).

-- Redis's own clock in ms; the shift exists only so tests can move time forward.
local function now_ms(shift)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(shift)
end

-- Integers as plain digits (Lua 5.1 would print large numbers in exponent form).
local function int(n)
  return string.format('%d', n)
end

local function split(s)
  local parts = {}
  for part in string.gmatch(s .. '|', '([^|]*)|') do
    parts[#parts + 1] = part
  end
  return parts
end
