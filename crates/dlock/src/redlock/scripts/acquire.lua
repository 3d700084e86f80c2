-- KEYS: lock, fence   ARGV: token, ttl_ms, owner
-- Returns {1, fence} when this node grants, {0, ms the holder has left} when it is held.
local token = holder(KEYS[1])
if token == false then
  return foreign(KEYS[1])
end
if token == ARGV[1] then
  -- A retry of this acquisition whose granting reply was lost: this node's grant is ours.
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  local _, fence = string.match(redis.call('GET', KEYS[1]), '^dlockr1%z([^%z]*)%z(%d+)%z')
  return {1, fence}
end
if token then
  return {0, redis.call('PTTL', KEYS[1])}
end
local last = last_fence(KEYS[2])
if last == false then
  return foreign(KEYS[2])
end
-- One more than this node's last fence, and never below its clock in ms * 1024, as the Redis
-- backend does: a node that lost its data, or came back with an older snapshot, still hands
-- out fences above every fence given a millisecond earlier (a lock cannot change hands 1024
-- times a ms; the node's clock must not step back).
local fence = fence_after(last)
redis.call('SET', KEYS[2], fence)
set_lock(KEYS[1], ARGV[1], fence, ARGV[3], ARGV[2], false)
return {1, fence}
