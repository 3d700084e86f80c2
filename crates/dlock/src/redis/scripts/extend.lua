-- KEYS: lock   ARGV: token, fence, ttl_ms
-- Makes the lease last at least ttl_ms from now (never shorter); ttl 0 only checks ownership.
-- Returns 1 when owned, 0 when not.
local holder, fence = read(KEYS[1])
if holder == false then
  return fence
end
if holder ~= ARGV[1] or fence ~= ARGV[2] then
  return 0
end
if ARGV[3] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3], 'GT')
end
return 1
