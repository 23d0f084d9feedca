#!lua flags=allow-oom
-- waitlist_serve: offer free seats of the activity's open teams to its line for any team
-- (after its stock was raised: units came back that no seat freed).
-- KEYS and ARGV: docs/scripts.md (groupbuy.locks.waitlist.WAITLIST_SERVE), named in
-- _pick_keys (the cursor is not read).
-- requires: _common
-- requires: _team_codes
-- requires: _pick_keys
-- requires: _team_lib
-- requires: _waitlist_lib
-- Returns {OK, offered}: seats offered now (at most those of 8 teams: call again while > 0).
local now = now_ms(shift_ms)
return {OK, hand_units({now = now}, 1)}
