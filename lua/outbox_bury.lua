#!lua flags=allow-oom
-- outbox_bury: move outbox entries that SQL can never apply (poison records) to the
-- dead-letter stream, then forget them in their outbox like outbox_ack does, all in one
-- atomic call: an entry leaves its outbox only once its dead letter exists.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.OUTBOX_BURY).
local stream = KEYS[1]
local pending = KEYS[2]
local dead_letters = KEYS[3]
local group = ARGV[1]
local member = ARGV[2]
local kind = ARGV[3]
local cap = ARGV[4]
local entries_at = 5
-- Returns {entries buried (0 for one already gone), entries left in the outbox}.
local buried = 0
for i = entries_at, #ARGV, 2 do
  local id = ARGV[i]
  local found = redis.call('XRANGE', stream, id, id)
  if #found == 1 then
    local letter = {'stream', kind, 'owner_id', member, 'entry_id', id,
                    'dead_letter_id', ARGV[i + 1]}
    local fields = found[1][2]
    for j = 1, #fields, 2 do
      letter[#letter + 1] = 'field.' .. fields[j]
      letter[#letter + 1] = fields[j + 1]
    end
    redis.call('XADD', dead_letters, 'MAXLEN', '~', cap, '*', unpack(letter))
    if group ~= '' then
      redis.call('XACK', stream, group, id)
    end
    buried = buried + redis.call('XDEL', stream, id)
  end
end
local left = redis.call('XLEN', stream)
if left == 0 then
  redis.call('ZREM', pending, member)
else
  local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  redis.call('ZADD', pending, string.match(oldest[1][1], '^%d+'), member)
end
return {buried, left}
