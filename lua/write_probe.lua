#!lua
-- write_probe: change nothing, only learn whether Redis takes writes now. Over maxmemory Redis
-- refuses a script that may write (no allow-oom, no no-writes flag) before it runs, with the
-- OOM error: a caller that must change SQL before its own script (an activity's row) asks first.
-- KEYS[1] a key of the slot the following write goes to (not read; routes the call)
-- Returns {0}.
return {0}
