#!lua flags=allow-oom
-- packet_read: a packet's state and one page of its grabs, after the lazy expiry check.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.read.PACKET_READ); the first ones are
-- named in _packet_lib.
local cursor = ARGV[3]
local limit = ARGV[4]
-- Returns {OK, packet hash and its terms as one flat list, the page as flat list (user, grab
-- value): the grabs of seq cursor + 1 to cursor + limit in seq order (fewer where a seq is
-- not taken), the number of grabs, the cursor of the next page or -1, now_ms}, or
-- {PACKET_NOT_FOUND}.
local now = now_ms(shift_ms)
local after, count = tonumber(cursor), tonumber(limit)
if not load_packet(now) then
  return {PACKET_NOT_FOUND}
end
local total = redis.call('HLEN', packet_grabs)
local page = {}
local next_cursor = -1
local seqs = redis.call('LLEN', packet_order)
if seqs >= total then
  local users = redis.call('LRANGE', packet_order, after, after + count - 1)
  local taken = {}
  for _, user in ipairs(users) do
    if user ~= '' then
      taken[#taken + 1] = user
    end
  end
  if #taken > 0 then
    local values = redis.call('HMGET', packet_grabs, unpack(taken))
    for i, user in ipairs(taken) do
      page[#page + 1] = user
      page[#page + 1] = values[i]
    end
  end
  if after + count < seqs then
    next_cursor = after + count
  end
else  -- grabs taken before the order list existed (a packet sent before the upgrade, read
      -- while it is still live): sort the grabs hash by seq
  local all = redis.call('HGETALL', packet_grabs)
  local grabs = {}
  for i = 1, #all, 2 do
    local seq = tonumber(split(all[i + 1])[1])
    if seq > after then
      grabs[#grabs + 1] = {seq, all[i], all[i + 1]}
    end
  end
  table.sort(grabs, function(a, b) return a[1] < b[1] end)
  for i = 1, math.min(count, #grabs) do
    page[#page + 1] = grabs[i][2]
    page[#page + 1] = grabs[i][3]
  end
  if #grabs > count then
    next_cursor = grabs[count][1]
  end
end
local packet = redis.call('HGETALL', packet_hash)
for _, value in ipairs(redis.call('HGETALL', packet_terms)) do
  packet[#packet + 1] = value
end
return {OK, packet, page, total, next_cursor, int(now)}
