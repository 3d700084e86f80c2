-- redis-py's layout: the lock is the key NAME holding the holder's token, with a PX expiry, as
-- redis-py's Lock writes it, so redis-py and dlock holders exclude each other. What redis-py
-- never reads is kept beside it, in the side key P pylock:NAME: token, fence, owner (NUL
-- separated), with the lock's expiry.
-- KEYS: lock (NAME), side   ARGV: token, ttl_ms, owner
-- Returns {1, fence} when granted (also to a retry of the same token, renewed to a full
-- lease), {0, ms left} when held by another (-1: a redis-py lock with no timeout).
local holder = redis.call('GET', KEYS[1])
local side = redis.call('GET', KEYS[2])
local side_token, side_fence
if side then
  side_token, side_fence = string.match(side, '^([^%z]*)%z(%d+)%z')
end
if holder and holder ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = side_fence
if not (holder and side_token == ARGV[1]) then
  fence = fence_after(side_fence)
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1] .. '\0' .. fence .. '\0' .. ARGV[3], 'PX', ARGV[2])
return {1, fence}
