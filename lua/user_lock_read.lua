#!lua flags=no-writes
-- user_lock_read: the user's live lock in an activity, from their current-lock key alone.
-- requires: _common
-- requires: _team_codes
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.scripts.USER_LOCK_READ).
local user_lock = KEYS[1]
local shift_ms = ARGV[1]
-- Returns {OK, team_id, locked_at_ms, expires_at_ms}, or {NO_LOCK}.
-- A read only (flags=no-writes: it runs over maxmemory and on replicas): a stale key is left
-- to its own PX, which the lock's ttl set, and to the scripts that overwrite it.
-- The value alone decides: a lock ends at its expiry or with its team at the deadline
-- (a team is formed only once no other lock is held), and every other ending (unlock,
-- confirm, a switch to another team) deletes or overwrites the key.
local now = now_ms(shift_ms)
local current = redis.call('GET', user_lock)
if not current then
  return {NO_LOCK}
end
local parts = split(current)
local expires, deadline = tonumber(parts[3]), tonumber(parts[4])
if now < expires and (deadline == nil or now < deadline) then
  return {OK, parts[1], parts[2], parts[3]}
end
return {NO_LOCK}
