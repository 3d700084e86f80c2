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
-- layout too, and must change with it). The fence arithmetic, shared with Redlock, is
-- fence.lua, prepended before this file.

-- The layout's version, the first field of every value: another layout is refused, not misread.
local LAYOUT = 'dlock1'
local SEP = '\0'
-- layout, token ('' when free), fence, holds, queued ('1' while the queue may have waiters),
-- then the owner exactly as the client wrote it (at, host, pid, label), never parsed here.
local PATTERN = '^dlock1%z([^%z]*)%z(%d+)%z(%d+)%z([01])%z(.*)$'

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
