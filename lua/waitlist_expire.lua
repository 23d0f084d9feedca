#!lua flags=allow-oom
-- waitlist_expire: end the waiting entries of an activity whose time ran out, in a batch
-- (the lock sweep's waitlist pass); one waitlist.expired record each.
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_EXPIRE), named in
-- _team_keys (team_id '').
-- requires: _common
-- requires: _team_codes
-- requires: _team_keys
-- requires: _team_lib
-- requires: _waitlist_lib
local batch = ARGV[5]
-- Returns {OK, expired now, 1 when more may be due else 0}.
local now = now_ms(shift_ms)
local due = redis.call('ZRANGEBYSCORE', A.waitlist_due, '-inf', now, 'LIMIT', 0, tonumber(batch))
for _, user in ipairs(due) do
  local entry = redis.call('HGET', A.waitlist, user)
  if entry and string.sub(entry, 1, 2) == 'q|' then
    local parts = split(entry)
    end_entry(user, parts, 'waitlist.expired', tonumber(parts[4]))
  else
    redis.call('ZREM', A.waitlist_due, user)
  end
end
return {OK, #due, #due == tonumber(batch) and 1 or 0}
