#!lua flags=allow-oom
-- outbox_read: the entries of an outbox stream from one id to another, for the write-behind
-- to write to SQL. A call's WAIT ([redis] wait_replicas) covers only what its own connection
-- wrote, so with publish = '1' the script also publishes (a write every replica receives,
-- with no key): the WAIT then vouches for everything this server held, these entries
-- included. SQL must not take a record that a failover could take back from Redis.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.OUTBOX_READ).
local stream = KEYS[1]
local first = ARGV[1]
local last = ARGV[2]
local most = ARGV[3]
local publish = ARGV[4]
-- Returns {entries read, {{id, {field, value, ...}}, ...}}.
local entries = redis.call('XRANGE', stream, first, last, 'COUNT', most)
if publish == '1' then
  redis.call('PUBLISH', 'groupbuy:replicated', stream)
end
return {#entries, entries}
