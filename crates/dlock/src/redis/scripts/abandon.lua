-- KEYS: lock, queue, qexp   ARGV: token, channel, release_if_held
-- An acquire call ended without the lock (timeout, cancelled): leave the queue, and, when an
-- attempt was cut off in flight, let go of the lock it may have taken. Wakes the next
-- waiter if that freed the lock or this waiter was first in line.
local token = ARGV[1]
local holder, fence, holds, queued, owner = read(KEYS[1])
if holder == false then
  holder = nil
end
local freed = holder ~= nil and ARGV[3] == '1' and holder == token
if freed then
  holder, holds = '', 0
end
if not holder or queued == '1' then
  local q = queue(KEYS[2], KEYS[3])
  local head = q.head(now_ms())
  local left = q.leave(token)
  if holder then
    if freed or (left and head == token and holder == '') then
      queued = q.wake(ARGV[2])
    elseif not q.exists() then
      queued = '0'
    end
  end
end
if holder then
  redis.call('SET', KEYS[1], encode(holder, fence, holds, queued, owner), 'KEEPTTL')
end
return 1
