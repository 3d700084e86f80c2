-- redis-py's layout (py_acquire.lua): a fenced write, the value (value_put.lua's hash) written
-- only while the lock's key holds this token, checked and written in this one script.
-- KEYS: lock (NAME), value key   ARGV: token, bytes
-- Returns the new version, or false when the hold is not current (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return false
end
local version = fence_after(redis.call('HGET', KEYS[2], 'version'), nil)
redis.call('HSET', KEYS[2], 'version', version, 'value', ARGV[2])
return version
