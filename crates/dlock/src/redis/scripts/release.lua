-- KEYS: lock, queue, qexp   ARGV: token, fence, channel
-- Returns the holds left (0: the lock is free), or -1 when this hold is not the lock's
-- (released, expired, broken, taken over).
local holder, fence, holds, queued, owner = read(KEYS[1])
if holder == false then
  return fence
end
if holder ~= ARGV[1] or fence ~= ARGV[2] then
  return -1
end
holds = holds - 1
if holds > 0 then
  redis.call('SET', KEYS[1], encode(holder, fence, holds, queued, owner), 'KEEPTTL')
  return holds
end
if queued == '1' then
  queued = queue(KEYS[2], KEYS[3]).wake(ARGV[3])
end
redis.call('SET', KEYS[1], encode('', fence, 0, queued, owner), 'KEEPTTL')
return 0
