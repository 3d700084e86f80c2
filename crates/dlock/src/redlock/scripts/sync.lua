-- KEYS: lock, fence   ARGV: token, fence, owner
-- After a quorum: this node granted with a lower fence than the quorum's highest; bring it to
-- that fence so the next holder continues from it. Returns 1 if the lock is still ours here.
if holder(KEYS[1]) ~= ARGV[1] then
  return 0
end
local fence = ARGV[2]
if fence_behind(KEYS[2], fence) then
  redis.call('SET', KEYS[2], fence)
end
set_lock(KEYS[1], ARGV[1], fence, ARGV[3], redis.call('PTTL', KEYS[1]), false)
return 1
