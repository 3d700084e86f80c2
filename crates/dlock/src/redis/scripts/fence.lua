-- Fence arithmetic, prepended to every script of the Redis and Redlock backends: fences and
-- value versions are decimal text, counted exactly past 2^53 (where a Lua number, a double,
-- stops rising by one) and refused past the client's signed 64-bit range.

-- Integers as decimal text: Redis would print large Lua numbers in exponent form.
local function integer(n)
  return string.format('%d', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2^53 - 1: the largest integer a Lua number (a double) holds exactly. Fences and versions
-- above it are counted as decimal text.
local EXACT = 9007199254740991
-- The largest fence the client reads (a signed 64-bit integer), as decimal text.
local FENCE_MAX = '9223372036854775807'

-- The decimal text `digits` (no leading zeros) plus one, exactly at any length.
local function plus_one(digits)
  local i = #digits
  while i > 0 and string.byte(digits, i) == 57 do -- '9'
    i = i - 1
  end
  if i == 0 then
    return '1' .. string.rep('0', #digits)
  end
  return string.sub(digits, 1, i - 1) .. string.char(string.byte(digits, i) + 1)
    .. string.rep('0', #digits - i)
end

-- Whether fence (or version) text `a` is below `b`: both decimal without leading zeros, as
-- the scripts write them, so the shorter is the smaller. Exact where tonumber() is not.
local function fence_below(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- The fence after `last` (nil when the store has none), as decimal text: one more than the
-- last, and never below the server's clock in ms * 1024. The floor is what keeps fences
-- rising when the store comes back with an older state (a restart from an older snapshot, a
-- failover to a replica that missed the last grants): every fence given out is below the
-- clock floor of a millisecond later, as long as a lock changes hands fewer than 1024 times a
-- millisecond and the server's clock does not step back. Past 2^53 the sum is taken on the
-- text (a double would stop rising there); past the client's 64-bit range it is refused.
local function fence_after(last, now)
  local floor = (now or now_ms()) * 1024
  if last then
    local n = tonumber(last)
    if n >= floor then
      if n < EXACT then
        return integer(n + 1)
      end
      local digits = string.match(last, '^0*(%d+)$')
      if not digits then
        error({err = 'DLOCKFENCE a fence counter that is not a decimal integer: ' .. last})
      end
      local next_fence = plus_one(digits)
      if fence_below(FENCE_MAX, next_fence) then
        error({err = 'DLOCKFENCE the fence counter is at ' .. digits
          .. ', the largest a client can read: no further fence can be given out'})
      end
      return next_fence
    end
  end
  return integer(floor)
end

