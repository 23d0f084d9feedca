#!lua
-- write_probe: change nothing, only learn whether Redis takes writes now. Over maxmemory Redis
-- refuses a script that may write (no allow-oom, no no-writes flag) before it runs, with the
-- OOM error: a caller that must change SQL before its own script (an activity's row) asks first.
-- KEYS and ARGV: docs/scripts.md (groupbuy.storage.calls.WRITE_PROBE); the key is not read,
-- it routes the call.
local route_key = KEYS[1]
-- Returns {0}.
return {0}
