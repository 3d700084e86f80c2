-- redis-py's layout (py_acquire.lua). KEYS: lock (NAME), side
-- Returns inspect.lua's reply: {} when free, else token, fence, holds, owner, ms left (-1
-- when the lock has no expiry) and '' for the waiters (none are kept). A holder that is not
-- dlock's (redis-py's) has fence 0 and no owner.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return {}
end
local fence, owner = '0', ''
local side = redis.call('GET', KEYS[2])
if side then
  local side_token, side_fence, side_owner = string.match(side, '^([^%z]*)%z(%d+)%z(.*)$')
  if side_token == holder then
    fence, owner = side_fence, side_owner
  end
end
return {holder, fence, '1', owner, tostring(redis.call('PTTL', KEYS[1])), ''}
