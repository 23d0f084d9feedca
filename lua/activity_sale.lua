#!lua
-- activity_sale: change an activity's stock and/or its end (PATCH /v1/activities/{aid}), the
-- stock decided against the units held in the same call: it may be raised, or lowered down
-- to what is held (members of open and formed teams + live locks), never below.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.sale.ACTIVITY_SALE).
-- requires: _common
-- requires: _team_codes
local activity_hash = KEYS[1]
local activity_counts = KEYS[2]
local activity_lock_expiries = KEYS[3]
local shift_ms = ARGV[1]
local stock = ARGV[2]
local ends_ms = ARGV[3]
-- Returns {OK, held} changed (held: the units held now),
-- {CONFLICT, held} the new stock is below what is held (nothing changed),
-- {ACTIVITY_NOT_FOUND} Redis has no copy of the activity or no counts (put them back from
-- SQL, call again).
if redis.call('EXISTS', activity_hash) == 0
    or redis.call('HEXISTS', activity_counts, 'counted') == 0 then
  return {ACTIVITY_NOT_FOUND}
end
local now = now_ms(shift_ms)
local held = tonumber(redis.call('HGET', activity_counts, 'members') or '0')
  + redis.call('ZCOUNT', activity_lock_expiries, '(' .. int(now), '+inf')
if stock ~= '' and tonumber(stock) < held then
  return {CONFLICT, held}
end
if stock ~= '' then
  redis.call('HSET', activity_hash, 'stock', stock)
end
if ends_ms ~= '' then
  redis.call('HSET', activity_hash, 'ends_ms', ends_ms)
end
return {OK, held}
