-- KEYS: lock  Returns {token, fence, holds, owner, ms left}, or {} when free.
local holder, fence, holds, queued, owner = read(KEYS[1])
if holder == false then
  return fence
end
if not holder or holder == '' then
  return {}
end
return {holder, fence, holds, owner, integer(redis.call('PTTL', KEYS[1]))}
