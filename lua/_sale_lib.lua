-- _sale_lib: the sale's gates (SPEC §3 Activities), shared by the scripts that take a unit of
-- the activity's stock (team_open, team_lock, team_join; team_confirm's late confirm) and by
-- activity_sale; groupbuy/storage/specs.py prepends it after _team_lib.
-- The activity's hash carries the sale (groupbuy.locks.activity_copy): starts_ms and ends_ms
-- (absent: no schedule), stock (absent or 0: no cap), max_hold_ms, late_confirm ('1').
-- A unit is held by every real member of an open or formed team (the counts hash's
-- `members`, kept by tally) and by every live lock (the lock-expiry zset's entries that
-- expire after now): what keeps those right moves the stock with them.

-- {ACTIVITY_NOT_STARTED, starts_ms} before the sale opens, {ACTIVITY_ENDED} from its end on,
-- nil while it runs; starts and ends are the activity hash's fields (nil: not set). No
-- command: the caller read them with the activity's other fields.
local function schedule_refusal(now, starts, ends)
  if starts and now < tonumber(starts) then
    return {ACTIVITY_NOT_STARTED, int(tonumber(starts))}
  end
  if ends and now >= tonumber(ends) then
    return {ACTIVITY_ENDED}
  end
  return nil
end

-- The units of the activity held at `now`: members + live locks (2 commands).
local function stock_held(now)
  return tonumber(redis.call('HGET', A.counts, 'members') or '0')
    + redis.call('ZCOUNT', A.lock_expiries, '(' .. int(now), '+inf')
end

-- The earliest live lock's expiry in the activity (ms), or '' when none.
local function next_unlock(now)
  local first = redis.call('ZRANGEBYSCORE', A.lock_expiries, '(' .. int(now), '+inf',
                           'WITHSCORES', 'LIMIT', 0, 1)
  return first[2] and int(tonumber(first[2])) or ''
end

-- 1 when `user` holds a live lock in the activity (the one their current-lock key names),
-- else 0: the unit of a lock the operation answers or releases (a re-lock, a switch) is not
-- counted against it. 1 command, 2 when the key exists.
local function own_lock(now, user_key, user)
  local current = redis.call('GET', user_key)
  if not current then
    return 0
  end
  local expires = redis.call('ZSCORE', A.lock_expiries, expiry_entry(split(current)[1], user))
  if expires and tonumber(expires) > now then
    return 1
  end
  return 0
end

-- {ACTIVITY_SOLD_OUT, next_unlock_ms or ''} when the activity has a stock (the hash's field,
-- nil or '0': none) and no unit is left for one more, not counting `own` units the
-- operation gives back; nil otherwise. No command without a stock.
local function stock_refusal(now, stock, own)
  stock = tonumber(stock or '0')
  if stock > 0 and stock_held(now) - own >= stock then
    return {ACTIVITY_SOLD_OUT, next_unlock(now)}
  end
  return nil
end
