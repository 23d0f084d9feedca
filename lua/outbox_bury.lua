#!lua flags=allow-oom
-- outbox_bury: move outbox entries that SQL can never apply (poison records) to the
-- dead-letter stream, then forget them in their outbox like outbox_ack does, all in one
-- atomic call: an entry leaves its outbox only once its dead letter exists.
-- KEYS[1] outbox stream  KEYS[2] pending index (zset member -> ms of the oldest entry)
-- KEYS[3] dead-letter stream (capped: the SQL table dead_letters keeps them all; the one of
--         the outbox's slot in Redis Cluster)
-- ARGV[1] consumer group that read the entries, or '' when read without one
-- ARGV[2] the stream's member in the pending index (activity_id or packet_id)
-- ARGV[3] the outbox's kind (packets|teams)  ARGV[4] approximate cap of the dead-letter stream
-- ARGV[5..] pairs: entry id, dead_letters row id in SQL
-- Returns {entries buried (0 for one already gone), entries left in the outbox}.
local buried = 0
for i = 5, #ARGV, 2 do
  local id = ARGV[i]
  local found = redis.call('XRANGE', KEYS[1], id, id)
  if #found == 1 then
    local letter = {'stream', ARGV[3], 'owner_id', ARGV[2], 'entry_id', id,
                    'dead_letter_id', ARGV[i + 1]}
    local fields = found[1][2]
    for j = 1, #fields, 2 do
      letter[#letter + 1] = 'field.' .. fields[j]
      letter[#letter + 1] = fields[j + 1]
    end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', unpack(letter))
    if ARGV[1] ~= '' then
      redis.call('XACK', KEYS[1], ARGV[1], id)
    end
    buried = buried + redis.call('XDEL', KEYS[1], id)
  end
end
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  redis.call('ZADD', KEYS[2], string.match(oldest[1][1], '^%d+'), ARGV[2])
end
return {buried, left}
