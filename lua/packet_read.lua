#!lua flags=allow-oom
-- packet_read: a packet's state and one page of its grabs, after the lazy expiry check.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.read.PACKET_READ); the first ones are
-- named in _packet_lib.
local cursor = ARGV[3]
local limit = ARGV[4]
-- Returns {OK, packet hash as flat list, the page as flat list (user, grab value): the grabs
-- of seq cursor + 1 to cursor + limit in seq order (fewer where a seq is not taken), the
-- number of grabs, the cursor of the next page or -1, now_ms}, or {PACKET_NOT_FOUND}.
local now = now_ms(shift_ms)
local after, count = tonumber(cursor), tonumber(limit)
local p = load_packet(now)
if not p then
  return {PACKET_NOT_FOUND}
end
local total = redis.call('HLEN', packet_grabs)
local page = {}
local next_cursor = -1
if redis.call('HLEN', packet_order) == total then
  -- The highest seq given so far: the grabs so far plus the seqs skipped by rebuilds.
  local top = p.count - p.remaining_count + p.seq_gap
  if p.seq_in_share then
    top = tonumber(redis.call('HGET', packet_hash, 'top_seq'))
  end
  local last = math.min(after + count, top)
  if last > after then
    local seqs = {}
    for seq = after + 1, last do
      seqs[#seqs + 1] = seq
    end
    local users = redis.call('HMGET', packet_order, unpack(seqs))
    local taken = {}
    for _, user in ipairs(users) do
      if user then
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
    if last < top then
      next_cursor = last
    end
  end
else  -- grabs taken before the order hash existed (a packet sent before the upgrade, read
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
return {OK, redis.call('HGETALL', packet_hash), page, total, next_cursor, int(now)}
