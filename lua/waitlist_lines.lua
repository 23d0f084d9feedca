#!lua flags=no-writes
-- waitlist_lines: how many wait in each named team's line (the console's table of teams).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_LINES).
-- requires: _common
-- requires: _team_codes
local activity_line = KEYS[1]
local team_ids_at = 1
-- Returns {OK, length of each team's line, in the order named}: one ZCARD each.
local lengths = {}
for i = team_ids_at, #ARGV do
  lengths[#lengths + 1] = redis.call('ZCARD', activity_line .. ':' .. ARGV[i])
end
return {OK, unpack(lengths)}
