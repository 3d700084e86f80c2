-- KEYS: lock   ARGV: token, channel
-- 1: released here; 0: not ours here (gone, expired or someone else's).
if holder(KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
