-- KEYS: readers, state   ARGV: token, fence, ttl_ms (0: only check)
-- Returns 1, or -1 when this hold is not the lock's. Never shortens a lease.
local readers, state, token = KEYS[1], KEYS[2], ARGV[1]
local now = now_ms()
if redis.call('HGET', state, token) ~= ARGV[2] then
  return -1
end
local lease_end = now + tonumber(ARGV[3])
local reader_end = redis.call('ZSCORE', readers, token)
if reader_end then
  if tonumber(reader_end) <= now then
    return -1
  end
  if lease_end > tonumber(reader_end) then
    redis.call('ZADD', readers, lease_end, token)
    redis.call('PEXPIREAT', readers, lease_end, 'GT')
  end
elseif redis.call('HGET', state, 'w') == token then
  local writer_end = tonumber(redis.call('HGET', state, 'we'))
  if writer_end <= now then
    return -1
  end
  if lease_end > writer_end then
    redis.call('HSET', state, 'we', integer(lease_end))
  end
else
  return -1
end
redis.call('PEXPIREAT', state, lease_end, 'GT')
return 1
