-- _packet_terms: the packet as SQL records it (the contract RECORDED in
-- groupbuy/redpacket/specs.py), which packet_create and packet_restore write the same way
-- (after _packet_lib): ARGV 3 to 15, after PACKET_ARGV.
local sender_id = ARGV[3]
local amount_cents = ARGV[4]
local count = ARGV[5]
local strategy = ARGV[6]
local created_ms = ARGV[7]
local expires_ms = ARGV[8]
local retention_ms = ARGV[9]
local message = ARGV[10]
local shares_sha256 = ARGV[11]
local recipients_count = ARGV[12]
local gate = ARGV[13]
local pw_salt = ARGV[14]
local pw_hash = ARGV[15]

-- Write the packet hash from its terms (status active, nothing grabbed, version 1: the
-- rebuild corrects what differs) and expire it with its keys; returns when they expire.
local function write_terms()
  local expire_at = tonumber(expires_ms) + tonumber(retention_ms)
  redis.call('HSET', packet_hash, 'sender_id', sender_id, 'amount', amount_cents,
             'count', count, 'strategy', strategy, 'status', 'active',
             'remaining_count', count, 'remaining_cents', amount_cents,
             'created_ms', created_ms, 'expires_ms', expires_ms,
             'expire_at_ms', int(expire_at), 'version', 1)
  if gate ~= '' then
    redis.call('HSET', packet_hash, 'gate', pw_hash ~= '' and (gate .. ':' .. pw_hash) or gate)
  end
  redis.call('PEXPIREAT', packet_hash, expire_at)
  redis.call('HSET', packet_terms, 'message', message, 'shares_sha256', shares_sha256,
             'recipients_count', recipients_count, 'pw_salt', pw_salt)
  redis.call('PEXPIREAT', packet_terms, expire_at)
  return expire_at
end

-- RPUSH ARGV[first..last] to a list, expiring with the packet; unpack() has a C-stack limit
-- near 8000 values, so in chunks.
local function push_chunked(key, first, last, expire_at)
  for at = first, last, 1000 do
    redis.call('RPUSH', key, unpack(ARGV, at, math.min(at + 999, last)))
  end
  if last >= first then
    redis.call('PEXPIREAT', key, expire_at)
  end
end

-- The recipients, ARGV[first..]: the set the grab checks, expiring with the packet.
local function add_recipients(first, expire_at)
  for at = first, #ARGV, 1000 do
    redis.call('SADD', packet_recipients, unpack(ARGV, at, math.min(at + 999, #ARGV)))
  end
  if #ARGV >= first then
    redis.call('PEXPIREAT', packet_recipients, expire_at)
  end
end
