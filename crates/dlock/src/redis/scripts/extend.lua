-- KEYS: lock   ARGV: token, fence, ttl_ms
-- Makes the lease last at least ttl_ms from now (never shorter); ttl 0 only checks ownership.
-- Returns 1 when owned, 0 when not.
local held = redis.call('HMGET', KEYS[1], 'token', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
local ttl = tonumber(ARGV[3])
if ttl > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
