-- KEYS: holders, fences   ARGV: token, fence, ttl_ms (0: only check)
-- Returns 1, or -1 when this permit is not held. Never shortens a lease.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now or redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return -1
end
local lease_end = now + tonumber(ARGV[3])
if lease_end > tonumber(score) then
  redis.call('ZADD', KEYS[1], lease_end, ARGV[1])
  redis.call('PEXPIREAT', KEYS[1], lease_end, 'GT')
  redis.call('PEXPIREAT', KEYS[2], lease_end, 'GT')
end
return 1
