#!lua
-- packet_grab: one user takes the next share of a packet, at most once.
-- requires: _common
-- requires: _packet_codes
-- requires: _packet_lib
-- KEYS and ARGV: docs/scripts.md (groupbuy.redpacket.grab.PACKET_GRAB); the first ones are
-- named in _packet_lib.
local user_id = ARGV[3]
local request_token = ARGV[4]
local resend_window_ms = ARGV[5]
local password_digest = ARGV[6]
-- Returns {OK, amount_cents, remaining_count, seq, epoch, grabbed_at_ms} grabbed (and recorded
-- in the outbox); the same answer again, nothing written, when the user's grab was taken by a
-- call with this token less than the resend window ago (the client library resent a call
-- whose reply it did not get: the first run's answer is the answer),
-- {ALREADY_GRABBED, amount_cents} the same amount as the first time (another request),
-- {USER_BLOCKED} an admin blocked the user (a grab taken before is still answered),
-- {SENDER_CANNOT_GRAB}, {NOT_A_RECIPIENT}, {SOLD_OUT}, {WITHDRAWN}, {EXPIRED} (the first call
-- after the deadline also closes the packet), {PASSWORD_LOCKED}, {WRONG_PASSWORD,
-- attempts_left} (a wrong digest is counted; a missing one is not), {PACKET_NOT_FOUND}.
-- Every refusal is decided before the grab's first write.
local now = now_ms(shift_ms)
local user = user_id
local p = load_packet(now)
if not p then
  return {PACKET_NOT_FOUND}
end
local prior = redis.call('HGET', packet_grabs, user)
if prior then
  local g = split(prior)  -- seq|amount|at_ms|token (groupbuy.redpacket.codec.Grab)
  if g[4] == request_token and now - tonumber(g[3]) <= tonumber(resend_window_ms) then
    local seq = tonumber(g[1])
    -- remaining_count as the first run answered it: the shares left after grab number seq
    -- (a rebuilt packet gives seqs out of line: there, the shares left now)
    local left = p.remaining_count
    if p.seq_gap >= 0 then
      left = p.count - (seq - p.seq_gap)
    end
    return {OK, tonumber(g[2]), left, seq, tonumber(p.epoch), g[3]}
  end
  return {ALREADY_GRABBED, tonumber(g[2])}
end
if redis.call('HEXISTS', packet_blocklist, user) == 1 then
  return {USER_BLOCKED}
end
local gate = p.gate
if gate then  -- a packet with terms: each letter one check (absent: anyone may grab)
  if string.find(gate, 's', 1, true) and user == p.sender_id then
    return {SENDER_CANNOT_GRAB}
  end
  if string.find(gate, 'r', 1, true)
      and redis.call('SISMEMBER', packet_recipients, user) == 0 then
    return {NOT_A_RECIPIENT}
  end
end
if p.status == 'expired' then
  return {EXPIRED}
end
if p.status == 'withdrawn' then
  return {WITHDRAWN}
end
if p.status ~= 'active' then
  return {SOLD_OUT}
end
if gate and string.find(gate, 'p', 1, true) then
  local wrong = tonumber(redis.call('HGET', packet_attempts, user) or '0')
  if wrong >= max_wrong_passwords then
    return {PASSWORD_LOCKED}
  end
  if password_digest ~= p.pw_hash then
    if password_digest ~= '' then
      wrong = redis.call('HINCRBY', packet_attempts, user, 1)
      if wrong == 1 then
        redis.call('PEXPIREAT', packet_attempts, redis.call('HGET', packet_hash, 'expire_at_ms'))
      end
    end
    return {WRONG_PASSWORD, max_wrong_passwords - wrong}
  end
end

local share = redis.call('LPOP', packet_shares)
if not share then
  return redis.error_reply('packet ' .. packet_id .. ' is active but has no shares left')
end
local seq
if p.seq_gap < 0 then  -- a rebuilt packet: each share carries its seq, "amount|seq"
  local bar = string.find(share, '|', 1, true)
  seq = tonumber(string.sub(share, bar + 1))
  share = string.sub(share, 1, bar - 1)
else
  seq = p.count - p.remaining_count + 1 + p.seq_gap
end
local left = p.remaining_count - 1
redis.call('HSET', packet_grabs, user, int(seq) .. '|' .. share .. '|' .. int(now) .. '|' .. request_token)
if p.seq_gap < 0 and seq <= redis.call('LLEN', packet_order) then
  redis.call('LSET', packet_order, seq - 1, user)  -- a seq a lost grab left free
else
  redis.call('RPUSH', packet_order, user)  -- the next seq: seqs are given in order
end
redis.call('HSET', packet_hash, 'remaining_count', int(left),
           'remaining_cents', int(p.remaining_cents - tonumber(share)))
redis.call('HINCRBY', packet_hash, 'version', 1)
if left == p.count - 1 then  -- the first grab creates the grabs hash and the order list
  local expire_at = redis.call('HGET', packet_hash, 'expire_at_ms')
  redis.call('PEXPIREAT', packet_grabs, expire_at)
  redis.call('PEXPIREAT', packet_order, expire_at)
end
emit({'type', 'grab', 'at_ms', int(now), 'packet_id', packet_id, 'user_id', user,
      'amount_cents', share, 'seq', int(seq), 'epoch', p.epoch})
if left == 0 then
  redis.call('HSET', packet_hash, 'status', 'sold_out', 'sold_out_ms', int(now))
  redis.call('ZREM', packet_due, packet_id)
  emit({'type', 'packet.sold_out', 'at_ms', int(now), 'packet_id', packet_id,
        'sender_id', p.sender_id, 'epoch', p.epoch,
        'version', redis.call('HINCRBY', packet_hash, 'version', 1)})
end
return {OK, tonumber(share), left, seq, tonumber(p.epoch), int(now)}
