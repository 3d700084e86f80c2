-- KEYS: lock, queue, qexp   ARGV: token, fence, channel
-- Returns the holds left (0: the lock is free), or -1 when this hold is not the lock's.
local lock = KEYS[1]
local held = redis.call('HMGET', lock, 'token', 'fence', 'holds')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end
local holds = tonumber(held[3]) - 1
if holds > 0 then
  redis.call('HSET', lock, 'holds', holds)
  return holds
end
redis.call('DEL', lock)
wake(KEYS[2], KEYS[3], ARGV[3])
return 0
