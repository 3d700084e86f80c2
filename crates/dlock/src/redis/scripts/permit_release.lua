-- KEYS: holders, fences   ARGV: token, fence ('*': any, for an abandoned acquire), channel
-- Returns 1, or -1 when this permit is not held (released, expired, broken).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local fence = redis.call('HGET', KEYS[2], ARGV[1])
if not score or (ARGV[2] ~= '*' and fence ~= ARGV[2]) then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], owner_of(ARGV[1]))
-- Every waiter tries again; one gets the permit (an empty payload wakes them all).
redis.call(PUBLISH, ARGV[3], '')
if tonumber(score) <= now_ms() then
  return -1
end
return 1
