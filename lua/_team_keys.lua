-- _team_keys: the KEYS and ARGV every script that names a team starts with (the contract
-- TEAM_KEYS / TEAM_ARGV in groupbuy/locks/script_contracts.py; docs/scripts.md): the team's
-- keys, then the activity's, all under the hash tag {a:<activity_id>}.
local team_hash = KEYS[1]
local team_members = KEYS[2]
local team_locks = KEYS[3]
local activity_outbox = KEYS[4]
local activity_lock_index = KEYS[5]
local activity_deadlines = KEYS[6]
local activity_pending = KEYS[7]
local activity_due_locks = KEYS[8]
local activity_due_deadlines = KEYS[9]
local activity_open_seats = KEYS[10]
local activity_counts = KEYS[11]
local activity_lock_expiries = KEYS[12]
local activity_hash = KEYS[13]
local activity_blocklist = KEYS[14]
local activity_waitlist = KEYS[15]
local activity_line = KEYS[16]
local activity_waitlist_due = KEYS[17]
local activity_id = ARGV[1]
local team_id = ARGV[2]
local shift_ms = ARGV[3]
local user_key_prefix = ARGV[4]

-- The team the script names: its id and keys (load_team adds its state).
local function named_team()
  return {id = team_id, hash = team_hash, members = team_members, locks = team_locks}
end

-- The keys of another team of this activity, built like the named team's (the waitlist
-- hands a unit that came back to whichever team has a free seat).
local function team_keys_of(id)
  local prefix = string.sub(team_hash, 1, #team_hash - #team_id)
  local hash = prefix .. id
  return {id = id, hash = hash, members = hash .. string.sub(team_members, #team_hash + 1),
          locks = hash .. string.sub(team_locks, #team_hash + 1)}
end
