#!lua
-- waitlist_leave: take a user's waiting entry out of the line (an offer stays: it is a lock).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_LEAVE).
-- requires: _common
-- requires: _team_codes
local activity_waitlist = KEYS[1]
local activity_line = KEYS[2]
local activity_waitlist_due = KEYS[3]
local user_id = ARGV[1]
-- Returns {OK, 1} removed, {OK, 0} the user was not waiting.
local entry = redis.call('HGET', activity_waitlist, user_id)
if not entry or string.sub(entry, 1, 2) ~= 'q|' then
  return {OK, 0}
end
local team = split(entry)[2]
redis.call('ZREM', team == '' and activity_line or activity_line .. ':' .. team, user_id)
redis.call('ZREM', activity_waitlist_due, user_id)
redis.call('HINCRBY', activity_waitlist, '~waiting', -1)
redis.call('HDEL', activity_waitlist, user_id)
return {OK, 1}
