-- A native semaphore: P permits:N is a zset of the permits' tokens scored by lease end
-- (server ms); P pfence:N a hash of each token's fence, '#' the last fence given out, and
-- '@' the number of permits the current holders asked for, and each holder's owner ('o:' token).
-- Both expire with the longest lease, so an idle semaphore leaves nothing behind.
-- KEYS: holders, fences   ARGV: token, ttl_ms, permits, owner
-- Returns {1, fence} when granted, {0, free_in_ms} when every permit is taken (-1: unknown),
-- {2, size} when the current holders use another number of permits.
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
if #expired > 0 then
  redis.call('ZREM', KEYS[1], unpack(expired))
  forget(KEYS[2], expired)
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  -- A retry of this acquisition whose granting reply was lost: the permit is ours (once).
  local lease_end = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], 'GT', lease_end, ARGV[1])
  local longest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIREAT', KEYS[1], longest)
  redis.call('PEXPIREAT', KEYS[2], longest)
  return {1, redis.call('HGET', KEYS[2], ARGV[1])}
end
local holders = redis.call('ZCARD', KEYS[1])
local size = tonumber(redis.call('HGET', KEYS[2], '@') or '0')
if holders > 0 and size > 0 and size ~= tonumber(ARGV[3]) then
  return {2, size}
end
if holders >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
-- As for locks: continue from the last fence, or from the clock floor when that is higher.
local fence = fence_after(redis.call('HGET', KEYS[2], '#') or nil, now)
local lease_end = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], lease_end, ARGV[1])
redis.call('HSET', KEYS[2], '#', fence, '@', ARGV[3], ARGV[1], fence,
  owner_of(ARGV[1]), ARGV[4])
local longest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[1], longest)
redis.call('PEXPIREAT', KEYS[2], longest)
return {1, fence}
