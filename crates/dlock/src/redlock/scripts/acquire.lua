-- KEYS: lock, fence   ARGV: token, ttl_ms, owner
-- Returns {1, fence} when this node grants, {0, ms the holder has left} when it is held.
local token = holder(KEYS[1])
if token == false then
  return foreign(KEYS[1])
end
if token then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = last_fence(KEYS[2]) + 1
if fence <= 0 then
  return foreign(KEYS[2])
end
if fence == 1 then
  -- No fence here: a new lock, or a node that lost its data (restarted without persistence).
  -- Starting from the node's clock in ms * 1024, as the Redis backend does, keeps fences
  -- growing when a majority forgets them (a lock cannot change hands 1024 times a ms).
  local t = redis.call('TIME')
  fence = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1024
end
redis.call('SET', KEYS[2], integer(fence))
set_lock(KEYS[1], ARGV[1], fence, ARGV[3], ARGV[2], false)
return {1, fence}
