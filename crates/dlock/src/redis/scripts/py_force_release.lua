-- redis-py's layout (py_acquire.lua). KEYS: lock (NAME)   ARGV: channel
-- Breaks the lock whoever holds it (a redis-py holder too). Returns 1 if it was held.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
redis.call(PUBLISH, ARGV[1], '')
return 1
