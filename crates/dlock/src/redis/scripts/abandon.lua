-- KEYS: lock, queue, qexp   ARGV: token, channel, release_if_held
-- An acquire call ended without the lock (timeout, cancelled): leave the queue, and, when an
-- attempt was cut off in flight, let go of the lock it may have taken. Wakes the next
-- waiter if that freed the lock or this waiter was first in line.
local lock, queue, qexp, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local now = now_ms()
local freed = false
if ARGV[3] == '1' and redis.call('HGET', lock, 'token') == token then
  redis.call('DEL', lock)
  freed = true
end
local head = queue_head(queue, qexp, now)
local left = redis.call('ZREM', queue, token) == 1
redis.call('ZREM', qexp, token)
if freed or (left and head == token and redis.call('EXISTS', lock) == 0) then
  wake(queue, qexp, ARGV[2])
end
return 1
