-- KEYS: lock, queue, qexp   ARGV: channel
-- Breaks the lock whoever holds it; the fence counter stays. Returns 1 if it was held.
if redis.call('HEXISTS', KEYS[1], 'token') == 0 then
  return 0
end
redis.call('DEL', KEYS[1])
wake(KEYS[2], KEYS[3], ARGV[1])
return 1
