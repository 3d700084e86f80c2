-- KEYS: lock, qexp  Returns {token, fence, holds, owner, ms left, live waiters}, or {} when free.
local holder, fence, holds, queued, owner = read(KEYS[1])
if holder == false then
  return fence
end
if not holder or holder == '' then
  return {}
end
local waiters = 0
if queued == '1' then
  waiters = redis.call('ZCOUNT', KEYS[2], '(' .. integer(now_ms()), '+inf')
end
return {holder, fence, holds, owner, integer(redis.call('PTTL', KEYS[1])), integer(waiters)}
