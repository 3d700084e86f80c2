-- Shared helpers, prepended to every script of dlock's Redis backend (one EVALSHA each).
-- Key layout, with P the client's prefix and N the lock name:
--   P lock:N   hash: token, fence, holds, label, host, pid, at (server ms); PEXPIRE = lease
--   P fence:N  string: the last fence given out for N
--   P queue:N  zset: waiting tokens, score = arrival (server ms)
--   P qexp:N   zset: waiting tokens, score = expiry of the waiter's place (server ms)
--   P wake:N   pub/sub channel: released; the payload names the waiter to wake

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as decimal text: Redis would print large Lua numbers in exponent form.
local function integer(n)
  return string.format('%d', n)
end

-- A key that exists but is not dlock's: fail at once instead of waiting forever.
local function foreign(key, detail)
  return redis.error_reply('DLOCKTYPE ' .. key .. ' ' .. detail)
end

-- Drops waiters whose place expired (crashed, paused, cancelled without clean-up).
local function purge_queue(queue, qexp, now)
  local dead = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 256)
  if #dead > 0 then
    redis.call('ZREM', queue, unpack(dead))
    redis.call('ZREM', qexp, unpack(dead))
  end
end

-- The live waiter first in line, with its arrival time, or nil.
local function queue_head(queue, qexp, now)
  purge_queue(queue, qexp, now)
  local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if head[1] then
    return head[1], tonumber(head[2])
  end
  return nil, nil
end

-- Tells waiters the lock is free: only the first live waiter in line (one wake-up per
-- release, no herd). Every waiter queues before it waits, so with no queue there is nobody
-- to tell, and a release costs no PUBLISH.
local function wake(queue, qexp, channel)
  if redis.call('EXISTS', queue) == 0 then
    return
  end
  local head = queue_head(queue, qexp, now_ms())
  if head then
    redis.call('PUBLISH', channel, head)
  end
end
