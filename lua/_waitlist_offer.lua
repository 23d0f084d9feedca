-- _waitlist_offer: what the scripts that answer a waitlist entry (waitlist_join,
-- waitlist_read) share; groupbuy/storage/specs.py prepends it after _common.

-- Whether an offer (its entry's parts) is still the user's live lock: their current-lock key
-- (`current`, its value or nil) names the offered team and has not expired. An offer
-- released, moved to another team or confirmed is not.
local function offer_held(parts, current, now)
  if not current then
    return false
  end
  local lock = split(current)
  return lock[1] == parts[2] and tonumber(lock[3]) > now
end
