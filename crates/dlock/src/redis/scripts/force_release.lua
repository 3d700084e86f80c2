-- KEYS: lock, queue, qexp   ARGV: channel
-- Breaks the lock whoever holds it; the fence stays. Returns 1 if it was held.
local holder, fence, holds, queued, owner = read(KEYS[1])
if holder == false then
  return fence
end
if not holder or holder == '' then
  return 0
end
if queued == '1' then
  queued = queue(KEYS[2], KEYS[3]).wake(ARGV[1])
end
redis.call('SET', KEYS[1], encode('', fence, 0, queued, owner), 'KEEPTTL')
return 1
