-- KEYS: readers, state   ARGV: token, fence ('*': any, for an abandoned acquire), channel
-- Returns 1, or -1 when this hold is not the lock's (released, expired, broken). A writer's
-- claim to the next turn is dropped too.
local readers, state, token = KEYS[1], KEYS[2], ARGV[1]
local now = now_ms()
local fence = redis.call('HGET', state, token)
local fence_ok = ARGV[2] == '*' or fence == ARGV[2]
local held = -1
local reader_end = redis.call('ZSCORE', readers, token)
if reader_end and fence_ok then
  redis.call('ZREM', readers, token)
  redis.call('HDEL', state, token, owner_of(token))
  if tonumber(reader_end) > now then
    held = 1
  end
elseif redis.call('HGET', state, 'w') == token and fence_ok then
  local writer_end = tonumber(redis.call('HGET', state, 'we'))
  redis.call('HDEL', state, 'w', 'we', token, owner_of(token))
  if writer_end > now then
    held = 1
  end
end
if redis.call('HGET', state, 'ww') == token then
  redis.call('HDEL', state, 'ww', 'wwe')
end
-- Every waiter tries again (an empty payload wakes them all).
redis.call(PUBLISH, ARGV[3], '')
return held
