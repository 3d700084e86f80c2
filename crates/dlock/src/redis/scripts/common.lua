-- Shared helpers, prepended to every script of dlock's Redis backend (one EVALSHA each), after
-- the constants WAITER_TTL and STARVATION (ms) that scripts.rs writes from the Rust side.
--
-- Key layout, with P the client's prefix and N the lock name:
--   P lock:N   string: the lock (see PATTERN); its TTL is the lease. A released lock keeps
--              its value (token '') until that TTL ends, so the next holder continues its
--              fence. One string keeps acquire and release at two commands each (GET + SET).
--   P queue:N  zset: waiting tokens, score = arrival (server ms); expires with its last place
--   P qexp:N   zset: waiting tokens, score = expiry of the waiter's place (server ms); ditto
--   P wake:N   pub/sub channel: released; the payload names the waiter to wake
--
-- Speed matters here: every operation is one of these scripts, and on a warm server a Lua
-- string loop or a table per call costs more than the commands themselves. So the value is
-- read with one pattern match and written with one concatenation, and the queue helpers are
-- only built (queue()) on the paths that need them. Even building this file's functions costs
-- about as much as a command on every call, so the common acquire, release and extension run
-- before it (acquire_fast.lua, release_fast.lua, extend_fast.lua: they read and write this
-- layout too, and must change with it).

-- The layout's version, the first field of every value: another layout is refused, not misread.
local LAYOUT = 'dlock1'
local SEP = '\0'
-- layout, token ('' when free), fence, holds, queued ('1' while the queue may have waiters),
-- then the owner exactly as the client wrote it (at, host, pid, label), never parsed here.
local PATTERN = '^dlock1%z([^%z]*)%z(%d+)%z(%d+)%z([01])%z(.*)$'

-- Integers as decimal text: Redis would print large Lua numbers in exponent form.
local function integer(n)
  return string.format('%d', n)
end

-- Reads the lock at `key`: (token, fence, holds, queued, owner), all nil when there is none,
-- or (false, error reply) for a value that is not a lock of this layout: fail at once rather
-- than wait on it forever.
local function read(key)
  local value = redis.call('GET', key)
  if not value then
    return nil
  end
  local token, fence, holds, queued, owner = string.match(value, PATTERN)
  if not token then
    return false, redis.error_reply('DLOCKTYPE ' .. key
      .. ' a value that is not a lock of this dlock version (' .. LAYOUT .. ')')
  end
  return token, fence, holds, queued, owner
end

local function encode(token, fence, holds, queued, owner)
  return LAYOUT .. SEP .. token .. SEP .. fence .. SEP .. holds .. SEP .. queued .. SEP .. owner
end

-- The field of a shared hold's state hash that keeps the holder's owner (for inspection),
-- beside the field named by its token (its fence).
local function owner_of(token)
  return 'o:' .. token
end

-- Drops the fence and owner fields of these holders from a shared hold's state hash.
local function forget(state, tokens)
  local fields = {}
  for i, token in ipairs(tokens) do
    fields[2 * i - 1] = token
    fields[2 * i] = owner_of(token)
  end
  redis.call('HDEL', state, unpack(fields))
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

-- The waiter queue of a lock, for the paths that wait, give up or hand over.
local function queue(queue_key, qexp_key)
  local q = {}

  -- Drops waiters whose place expired (crashed, paused, cancelled without clean-up).
  local function purge(now)
    local dead = redis.call('ZRANGEBYSCORE', qexp_key, '-inf', now, 'LIMIT', 0, 256)
    if #dead > 0 then
      redis.call('ZREM', queue_key, unpack(dead))
      redis.call('ZREM', qexp_key, unpack(dead))
    end
  end

  -- The live waiter first in line, with its arrival time, or nil.
  function q.head(now)
    purge(now)
    local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
    if head[1] then
      return head[1], tonumber(head[2])
    end
    return nil, nil
  end

  -- Joining (or renewing a place) also pushes both keys' expiry past every live waiter's
  -- place, so a queue whose waiters all crashed disappears on its own: nothing per name is
  -- left behind once nobody waits.
  function q.join(token, now)
    redis.call('ZADD', queue_key, 'NX', now, token)
    redis.call('ZADD', qexp_key, now + WAITER_TTL, token)
    redis.call('PEXPIRE', queue_key, WAITER_TTL)
    redis.call('PEXPIRE', qexp_key, WAITER_TTL)
  end

  -- Returns whether the token was in the queue.
  function q.leave(token)
    local left = redis.call('ZREM', queue_key, token) == 1
    redis.call('ZREM', qexp_key, token)
    return left
  end

  function q.expiry(token)
    return tonumber(redis.call('ZSCORE', qexp_key, token))
  end

  function q.exists()
    return redis.call('EXISTS', queue_key) == 1
  end

  -- The lock is free: wake the first live waiter in line (one wake-up per release, no
  -- herd). Returns the new 'queued' flag: '0' once nobody is left, so later calls skip the
  -- queue altogether.
  function q.wake(channel)
    local head = q.head(now_ms())
    if head then
      redis.call(PUBLISH, channel, head)
      return '1'
    end
    return '0'
  end

  return q
end
