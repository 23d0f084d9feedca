-- _packet_lib: helpers shared by the packet_* scripts (after _common).
-- Common KEYS of packet scripts (all under the hash tag {p:<packet_id>}):
-- KEYS[1] packet hash  KEYS[2] shares list (amounts still to grab, in grab order)
-- KEYS[3] grabs hash (user -> "seq|amount_cents|grabbed_at_ms|request token")  KEYS[4] outbox stream
-- Indexes of waiting work: one each on one Redis server, those of the packet's slot in Redis
-- Cluster (groupbuy.storage.keys, docs/architecture.md "Indexes of waiting work"):
-- KEYS[5] pending index (zset packet_id -> ms of the oldest record waiting in its outbox)
-- KEYS[6] due index (zset packet_id -> expires_ms, active packets only)
-- KEYS[7] blocked users hash (user_id -> when, and why; read by packet_grab; the copy of the
-- packet's slot in Redis Cluster)
-- Common ARGV: ARGV[1] packet_id  ARGV[2] clock shift in ms (0 in production)
-- Packet hash fields: sender_id, amount, count, strategy, status (active|sold_out|expired),
-- remaining_count, remaining_cents, created_ms, expires_ms, sold_out_ms, expired_ms, refunded,
-- expire_at_ms (when Redis drops the packet's keys: expiry + retention); after a rebuild from
-- SQL (packet_restore) also epoch (how many times it was rebuilt: every record carries it, so
-- SQL can fence out records of a lost epoch) and seq_gap (added to each new grab's seq, so it
-- follows every seq SQL has recorded); version counts its changes (1 when created, +1 for
-- each grab, sold out, expiry), and every record carries the version after its change.

-- Code numbers, mirrored by groupbuy.redpacket.codes.PacketCode.
local OK, EXISTING, NOT_FOUND, ALREADY_GRABBED, SOLD_OUT, EXPIRED, NOT_DUE = 0, 1, 2, 3, 4, 5, 6
local USER_BLOCKED, LIMIT_EXCEEDED = 7, 8

-- Append one record for SQL to the packet's outbox. The pending index lists the packet
-- from its first waiting record (the entry id's ms) until outbox_ack leaves it empty.
local function emit(fields)
  local id = redis.call('XADD', KEYS[4], '*', unpack(fields))
  redis.call('ZADD', KEYS[5], 'NX', string.match(id, '^%d+'), ARGV[1])
end

-- Close a packet whose time is up: what is left goes back to the sender, recorded once
-- because only an active packet can get here and it leaves here expired.
local function expire_packet(p)
  redis.call('HSET', KEYS[1], 'status', 'expired', 'expired_ms', int(p.expires_ms),
             'refunded', int(p.remaining_cents))
  local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[6], ARGV[1])
  emit({'type', 'packet.refunded', 'at_ms', int(p.expires_ms), 'packet_id', ARGV[1],
        'sender_id', p.sender_id, 'refunded_cents', int(p.remaining_cents),
        'remaining_count', int(p.remaining_count), 'epoch', p.epoch, 'version', version})
  p.status = 'expired'
  p.just_expired = true
end

-- The packet's state after the lazy expiry check, or nil if Redis does not know it.
local function load_packet(now)
  local f = redis.call('HMGET', KEYS[1], 'status', 'count', 'remaining_count',
                       'remaining_cents', 'expires_ms', 'sender_id', 'epoch', 'seq_gap')
  if not f[1] then
    return nil
  end
  local p = {status = f[1], count = tonumber(f[2]), remaining_count = tonumber(f[3]),
             remaining_cents = tonumber(f[4]), expires_ms = tonumber(f[5]), sender_id = f[6],
             epoch = f[7] or '0', seq_gap = tonumber(f[8] or '0')}
  if p.status == 'active' and now >= p.expires_ms then
    expire_packet(p)
  end
  return p
end
