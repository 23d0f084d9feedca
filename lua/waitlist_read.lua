#!lua flags=no-writes
-- waitlist_read: a user's waitlist entry, or the offer the line made them.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_READ).
-- requires: _common
-- requires: _waitlist_offer
-- requires: _team_codes
local activity_waitlist = KEYS[1]
local activity_line = KEYS[2]
local user_lock = KEYS[3]
local user_id = ARGV[1]
local shift_ms = ARGV[2]
-- Returns {QUEUED, position, expires_at_ms, team_id, queued_at_ms} waiting,
-- {OFFERED, team_id, locked_at_ms, expires_at_ms, version, queued_at_ms} the offer (while it is the user's
-- live lock: not expired, released, moved or confirmed), {NOT_WAITING}. The position is a rank: no scan of the line.
local entry = redis.call('HGET', activity_waitlist, user_id)
if not entry then
  return {NOT_WAITING}
end
local parts = split(entry)
local now = now_ms(shift_ms)
if tonumber(parts[4]) <= now then
  return {NOT_WAITING}
end
if parts[1] == 'o' then
  if offer_held(parts, redis.call('GET', user_lock), now) then
    return {OFFERED, parts[2], parts[3], parts[4], parts[5], parts[6]}
  end
  return {NOT_WAITING}
end
local line = parts[2] == '' and activity_line or activity_line .. ':' .. parts[2]
local rank = redis.call('ZRANK', line, user_id)
if not rank then
  return {NOT_WAITING}
end
return {QUEUED, rank + 1, parts[4], parts[2], parts[3]}
