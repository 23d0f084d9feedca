-- _team_codes: the reply codes of the team_* scripts and user_lock_read.
-- Code numbers, mirrored by groupbuy.locks.codes.TeamCode. A refusal's name is its HTTP
-- problem code, upper-cased (TEAM_FULL: team_full).
local OK, EXISTING, TEAM_FULL, ALREADY_MEMBER, TEAM_FORMED, TEAM_FAILED = 0, 1, 2, 3, 4, 5
local TEAM_NOT_FOUND, ACTIVITY_NOT_FOUND, LOCK_REQUIRED, CONFLICT, SWITCH_NEEDED = 6, 7, 8, 9, 10
local NO_LOCK, NO_TEAM_AVAILABLE, LOOK_FURTHER, USER_LIMIT_REACHED = 11, 12, 13, 14
local USER_BLOCKED, ACTIVITY_CLOSED, ACTIVITY_NOT_STARTED, ACTIVITY_ENDED = 15, 16, 17, 18
local ACTIVITY_SOLD_OUT, NOT_A_MEMBER, ORDER_MISMATCH = 19, 20, 21
local LEFT_TEAM = 22
local INVALID_REQUEST = 23
local QUEUED, OFFERED, TAKE_SEAT, WAITLIST_FULL, ALREADY_LOCKED, NOT_WAITING = 24, 25, 26, 27, 28, 29
