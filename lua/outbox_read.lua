#!lua flags=allow-oom
-- outbox_read: the entries of an outbox stream from one id to another, for the write-behind
-- to write to SQL. A call's WAIT ([redis] wait_replicas) covers only what its own connection
-- wrote, so with ARGV[4] = '1' the script also publishes (a write every replica receives,
-- with no key): the WAIT then vouches for everything this server held, these entries
-- included. SQL must not take a record that a failover could take back from Redis.
-- KEYS[1] outbox stream
-- ARGV[1] first id ('-': from the start)  ARGV[2] last id ('+': to the end)
-- ARGV[3] most entries  ARGV[4] '1': publish (the caller waits for replicas), '0': not
-- Returns {entries read, {{id, {field, value, ...}}, ...}}.
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
if ARGV[4] == '1' then
  redis.call('PUBLISH', 'groupbuy:replicated', KEYS[1])
end
return {#entries, entries}
