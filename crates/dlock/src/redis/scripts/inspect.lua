-- KEYS: lock  Returns {token, fence, holds, label, host, pid, at, pttl}, or {} when free.
local held = redis.call('HMGET', KEYS[1], 'token', 'fence', 'holds', 'label', 'host', 'pid', 'at')
if not held[1] then
  return {}
end
held[8] = redis.call('PTTL', KEYS[1])
return held
