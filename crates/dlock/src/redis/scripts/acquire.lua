-- KEYS: lock, fence, queue, qexp
-- ARGV: token, ttl_ms, reentrant, fair, waits, waiter_ttl_ms, starvation_ms, label, host, pid,
--       queued (an earlier attempt of this call put it in the queue)
-- Returns {1, fence, reentered} when granted, {0, free_in_ms} when busy (-1: unknown).
local lock, fence_key, queue, qexp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl = ARGV[1], tonumber(ARGV[2])
local reentrant, fair, waits = ARGV[3] == '1', ARGV[4] == '1', ARGV[5] == '1'
local waiter_ttl, starvation = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()

local function busy(free_in)
  if waits then
    redis.call('ZADD', queue, 'NX', now, token)
    redis.call('ZADD', qexp, now + waiter_ttl, token)
  end
  return {0, free_in}
end

local held = redis.call('HMGET', lock, 'token', 'fence', 'holds')
if held[1] then
  if reentrant and held[1] == token then
    redis.call('HINCRBY', lock, 'holds', 1)
    if redis.call('PTTL', lock) < ttl then
      redis.call('PEXPIRE', lock, ttl)
    end
    return {1, tonumber(held[2]), 1}
  end
  return busy(redis.call('PTTL', lock))
end
if redis.call('EXISTS', lock) == 1 then
  return foreign(lock, 'a hash without a lock token')
end

local head, since = nil, nil
if redis.call('EXISTS', queue) == 1 then
  head, since = queue_head(queue, qexp, now)
end
if head and head ~= token and (fair or now - since >= starvation) then
  local head_expiry = tonumber(redis.call('ZSCORE', qexp, head))
  return busy(head_expiry - now)
end

-- The counter starts from the server clock (ms * 1024), so fences keep growing even after
-- the counter is lost (a restart without persistence, an eviction, its idle expiry).
local fence = redis.pcall('INCR', fence_key)
if type(fence) == 'table' and fence.err then
  return foreign(fence_key, 'not a fence counter: ' .. fence.err)
end
local floor = now * 1024
if fence < floor then
  fence = floor
  redis.call('SET', fence_key, integer(fence))
end
-- Idle counters go away; the clock floor above keeps fences growing when one is re-created.
redis.call('PEXPIRE', fence_key, 86400000)
redis.call('HSET', lock, 'token', token, 'fence', integer(fence), 'holds', 1,
  'label', ARGV[8], 'host', ARGV[9], 'pid', ARGV[10], 'at', integer(now))
redis.call('PEXPIRE', lock, ttl)
if ARGV[11] == '1' then
  redis.call('ZREM', queue, token)
  redis.call('ZREM', qexp, token)
end
return {1, fence, 0}
