-- _pick_keys: the KEYS and ARGV of the scripts that pick among an activity's teams instead
-- of being named one (team_join, team_list; the contract PICK_KEYS / PICK_ARGV in
-- groupbuy/locks/script_contracts.py; docs/scripts.md).
local activity_outbox = KEYS[1]
local activity_lock_index = KEYS[2]
local activity_deadlines = KEYS[3]
local activity_pending = KEYS[4]
local activity_due_locks = KEYS[5]
local activity_due_deadlines = KEYS[6]
local activity_open_seats = KEYS[7]
local activity_counts = KEYS[8]
local activity_lock_expiries = KEYS[9]
local activity_hash = KEYS[10]
local activity_blocklist = KEYS[11]
local activity_waitlist = KEYS[12]
local activity_line = KEYS[13]
local activity_waitlist_due = KEYS[14]
local activity_id = ARGV[1]
local shift_ms = ARGV[2]
local team_key_prefix = ARGV[3]
local members_suffix = ARGV[4]
local locks_suffix = ARGV[5]
local user_key_prefix = ARGV[6]
local candidates = ARGV[7]
local cursor_score = ARGV[8]
local cursor_team_id = ARGV[9]

-- The keys of a team of this activity (load_team adds its state).
local function team_keys_of(id)
  local hash = team_key_prefix .. id
  return {id = id, hash = hash, members = hash .. members_suffix, locks = hash .. locks_suffix}
end
