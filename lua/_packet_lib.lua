-- _packet_lib: the KEYS and ARGV every packet script starts with (the contract PACKET_KEYS /
-- PACKET_ARGV in groupbuy/redpacket/specs.py; docs/scripts.md), all under the hash tag
-- {p:<packet_id>}, and helpers shared by those scripts (after _common and _packet_codes).
-- Packet hash fields: sender_id, amount, count, strategy, status
-- (active|sold_out|expired|withdrawn), remaining_count, remaining_cents, created_ms,
-- expires_ms, sold_out_ms, expired_ms, withdrawn_ms, refunded, expire_at_ms (when Redis drops
-- the packet's keys: expiry + retention), gate (absent for a packet anyone may grab; else the
-- letters of the grab's checks: r only recipients, p a password, s not the sender, then for
-- a password ':' and its salted hash); after a rebuild from SQL (packet_restore) also epoch
-- (how many times it was rebuilt: every record carries it, so SQL can fence out records of
-- a lost epoch) and seq_gap: -1 when each queued share reads "amount|seq" (the grab takes
-- that seq, the share's place in the commitment); a packet rebuilt by an older release has
-- seq_gap >= 0 instead, added to each new grab's seq. version counts its changes (1 when
-- created, +1 for each grab, sold out, expiry, +2 for a withdrawal: withdrawn, then
-- refunded), and every record carries the version after its change.
-- The packet's own keys besides: its queued shares (list), grabs (hash user -> grab value),
-- order (list: the i-th entry is the user of seq i, '' for a seq not taken; reads page
-- through it), recipients (set, only for a packet with recipients), attempts (hash user ->
-- wrong passwords) and terms (hash: message, shares_sha256, recipients_count, pw_salt: what
-- reads show, apart from the hash every grab reads).

local packet_hash = KEYS[1]
local packet_shares = KEYS[2]
local packet_grabs = KEYS[3]
local packet_outbox = KEYS[4]
local packet_pending = KEYS[5]
local packet_due = KEYS[6]
local packet_blocklist = KEYS[7]
local packet_order = KEYS[8]
local packet_recipients = KEYS[9]
local packet_attempts = KEYS[10]
local packet_terms = KEYS[11]
local packet_id = ARGV[1]
local shift_ms = ARGV[2]

-- Wrong passwords a user may give before the packet refuses them even the right one.
local max_wrong_passwords = 5

-- Append one record for SQL to the packet's outbox. The pending index lists the packet
-- from its first waiting record (the entry id's ms) until outbox_ack leaves it empty.
local function emit(fields)
  local id = redis.call('XADD', packet_outbox, '*', unpack(fields))
  redis.call('ZADD', packet_pending, 'NX', string.match(id, '^%d+'), packet_id)
end

-- End an active packet with a refund of what is left to the sender (`status` expired or
-- withdrawn, at `at`): recorded once, because only an active packet can get here and it
-- leaves here ended. A withdrawal is said first (packet.withdrawn), then the refund.
local function end_with_refund(p, status, at)
  redis.call('HSET', packet_hash, 'status', status, status .. '_ms', int(at),
             'refunded', int(p.remaining_cents))
  redis.call('DEL', packet_shares)
  redis.call('ZREM', packet_due, packet_id)
  if status == 'withdrawn' then
    emit({'type', 'packet.withdrawn', 'at_ms', int(at), 'packet_id', packet_id,
          'sender_id', p.sender_id, 'epoch', p.epoch,
          'version', redis.call('HINCRBY', packet_hash, 'version', 1)})
  end
  emit({'type', 'packet.refunded', 'at_ms', int(at), 'packet_id', packet_id,
        'sender_id', p.sender_id, 'refunded_cents', int(p.remaining_cents),
        'remaining_count', int(p.remaining_count), 'reason', status, 'epoch', p.epoch,
        'version', redis.call('HINCRBY', packet_hash, 'version', 1)})
  p.status = status
end

-- Close a packet whose time is up: what is left goes back to the sender.
local function expire_packet(p)
  end_with_refund(p, 'expired', p.expires_ms)
  p.just_expired = true
end

-- The packet's state after the lazy expiry check, or nil if Redis does not know it.
local function load_packet(now)
  local f = redis.call('HMGET', packet_hash, 'status', 'count', 'remaining_count',
                       'remaining_cents', 'expires_ms', 'sender_id', 'epoch', 'seq_gap',
                       'gate')
  if not f[1] then
    return nil
  end
  local p = {status = f[1], count = tonumber(f[2]), remaining_count = tonumber(f[3]),
             remaining_cents = tonumber(f[4]), expires_ms = tonumber(f[5]), sender_id = f[6],
             epoch = f[7] or '0', seq_gap = tonumber(f[8] or '0')}
  if f[9] then  -- the grab's checks: "<letters>" or "<letters>:<password hash>"
    local colon = string.find(f[9], ':', 1, true)
    p.gate = colon and string.sub(f[9], 1, colon - 1) or f[9]
    p.pw_hash = colon and string.sub(f[9], colon + 1)
  end
  if p.status == 'active' and now >= p.expires_ms then
    expire_packet(p)
  end
  return p
end
