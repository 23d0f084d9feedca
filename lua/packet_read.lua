#!lua flags=allow-oom
-- packet_read: a packet's state and one page of its grabs, after the lazy expiry check.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.read.PACKET_READ); the first ones are
-- named in _packet_lib.
local cursor = ARGV[3]
local limit = ARGV[4]
-- Returns {OK, packet hash as flat list, the page as flat list (user, grab value) in grab
-- order from position `cursor`, at most `limit` grabs, the number of grabs, now_ms}, or
-- {PACKET_NOT_FOUND}.
local now = now_ms(shift_ms)
local first, count = tonumber(cursor), tonumber(limit)
if not load_packet(now) then
  return {PACKET_NOT_FOUND}
end
local total = redis.call('HLEN', packet_grabs)
local page = {}
if redis.call('ZCARD', packet_order) == total then
  local users = redis.call('ZRANGE', packet_order, first, first + count - 1)
  if #users > 0 then
    local values = redis.call('HMGET', packet_grabs, unpack(users))
    for i, user in ipairs(users) do
      page[#page + 1] = user
      page[#page + 1] = values[i]
    end
  end
else  -- grabs taken before the order list existed: sort the hash by seq (a packet sent
      -- before the upgrade, read while it is still live)
  local all = redis.call('HGETALL', packet_grabs)
  local grabs = {}
  for i = 1, #all, 2 do
    grabs[#grabs + 1] = {tonumber(split(all[i + 1])[1]), all[i], all[i + 1]}
  end
  table.sort(grabs, function(a, b) return a[1] < b[1] end)
  for i = first + 1, math.min(first + count, #grabs) do
    page[#page + 1] = grabs[i][2]
    page[#page + 1] = grabs[i][3]
  end
end
return {OK, redis.call('HGETALL', packet_hash), page, total, int(now)}
