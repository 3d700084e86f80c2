-- Shared by the Redlock scripts; each runs on one node, atomically there, after the Redis
-- backend's fence.lua (fences are decimal text, exact past 2^53).
-- Keys on every node, with P the prefix and N the lock name:
--   P rlock:N   string 'dlockr1' NUL token NUL fence NUL owner; its TTL is the lease
--   P rfence:N  string: the last fence this node gave out or was told about (no TTL, so a
--               fence survives the lock; only a node that loses its data forgets it, and
--               then starts again from its clock, see acquire.lua)
--   P wake:N    pub/sub channel: released (the payload is empty: every waiter retries)

-- The token of the lock value at `key`: nil when free, false for a foreign value.
local function holder(key)
  local value = redis.call('GET', key)
  if not value then
    return nil
  end
  local token = string.match(value, '^dlockr1%z([^%z]*)%z')
  if not token then
    return false
  end
  return token
end

local function foreign(key)
  return redis.error_reply('DLOCKTYPE ' .. key .. ' a value that is not a Redlock lock of this dlock version')
end

-- This node's last fence at `key` as decimal text without leading zeros: nil when it has
-- none, false for a value that is not one.
local function last_fence(key)
  local last = redis.call('GET', key)
  if not last then
    return nil
  end
  return string.match(last, '^0*(%d+)$') or false
end

-- Whether this node's last fence at `key` is below `fence` (decimal text): exact at any size.
local function fence_behind(key, fence)
  local last = last_fence(key)
  return last == nil or (last and fence_below(last, fence))
end

local function set_lock(key, token, fence, owner, ttl, nx)
  local value = 'dlockr1\0' .. token .. '\0' .. fence .. '\0' .. owner
  if nx then
    return redis.call('SET', key, value, 'PX', ttl, 'NX')
  end
  return redis.call('SET', key, value, 'PX', ttl)
end
