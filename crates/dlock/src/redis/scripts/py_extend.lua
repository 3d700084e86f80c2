-- redis-py's layout (py_acquire.lua). KEYS: lock (NAME), side   ARGV: token, ttl_ms
-- Makes the lease last at least ttl_ms from now (never shorter); ttl 0 only checks ownership.
-- Returns 1 when owned, 0 when not.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  redis.call('PEXPIRE', KEYS[2], ARGV[2], 'GT')
end
return 1
