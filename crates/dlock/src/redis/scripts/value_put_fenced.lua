-- A fenced write: the value (value_put.lua's hash) written only while the lock's holder is
-- this token with this fence, checked and written in this one script. An expired lease is a
-- missing key (its TTL is the lease), a released lock has the token '', a broken one no key.
-- KEYS: lock key, value key (one slot in a Cluster). ARGV: token, fence, bytes.
-- Returns the new version, or false when the hold is not current (nothing written).
-- Runs after common.lua.
local holder, fence = read(KEYS[1])
if holder == false then
  return fence
end
if holder ~= ARGV[1] or fence ~= ARGV[2] then
  return false
end
local version = fence_after(redis.call('HGET', KEYS[2], 'version'), nil)
redis.call('HSET', KEYS[2], 'version', version, 'value', ARGV[3])
return version
