-- KEYS: lock, fence   ARGV: token, ttl_ms, heal, fence, owner
-- 1: ours here, lease now at least ttl_ms (0 only checks); 0: free here; -1: someone else's.
-- With `heal` (sent only once a quorum has confirmed the lock), a node where the lock is
-- free takes it back (2): it had restarted or missed the acquire. Healed nodes never count
-- towards the quorum; only nodes that kept the lock do.
local token = holder(KEYS[1])
if token == false then
  return foreign(KEYS[1])
end
if token == ARGV[1] then
  if ARGV[2] ~= '0' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  end
  return 1
end
if token ~= nil then
  return -1
end
if ARGV[3] == '1' then
  local fence = ARGV[4]
  if fence_behind(KEYS[2], fence) then
    redis.call('SET', KEYS[2], fence)
  end
  set_lock(KEYS[1], ARGV[1], fence, ARGV[5], ARGV[2], true)
  return 2
end
return 0
