-- redis-py's layout (py_acquire.lua). KEYS: lock (NAME)   ARGV: token, channel
-- Deletes the lock as redis-py's release does; the side key keeps the last fence for the next
-- holder until it expires. Wakes every waiter of this client's kind (redis-py's own waiters
-- poll). Returns 0 when released, -1 when this token does not hold the lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call(PUBLISH, ARGV[2], '')
return 0
