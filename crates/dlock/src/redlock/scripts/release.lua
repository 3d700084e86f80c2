-- KEYS: lock, waiting   ARGV: token, channel
-- 1: released here; 0: not ours here (gone, expired or someone else's).
if holder(KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
-- Nobody waits (no call found it busy lately): nothing to publish.
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
