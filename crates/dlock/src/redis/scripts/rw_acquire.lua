-- A native read-write lock: P rwr:N is a zset of the readers' tokens scored by lease end
-- (server ms); P rw:N a hash with each holder's fence (field = token), '#' the last fence, the
-- writer ('w' token, 'we' lease end) and the writer waiting for the readers to leave ('ww'
-- token, 'wwe' end of its claim, refreshed by its attempts). While a writer holds or waits, new
-- readers wait: writers are not starved. Both keys expire with the last lease or claim.
-- KEYS: readers, state   ARGV: token, ttl_ms, mode ('r' | 'w'), max_readers, waits ('1' | '0'),
-- owner (kept in the field 'o:' token, for inspection)
-- Returns {1, fence} when granted, {0, free_in_ms} when not (-1: unknown).
local now = now_ms()
local readers, state, token = KEYS[1], KEYS[2], ARGV[1]
local expired = redis.call('ZRANGEBYSCORE', readers, '-inf', now, 'LIMIT', 0, 256)
if #expired > 0 then
  redis.call('ZREM', readers, unpack(expired))
  forget(state, expired)
end
local s = redis.call('HMGET', state, 'w', 'we', 'ww', 'wwe')
local writer, writer_end, claim, claim_end = s[1], tonumber(s[2]), s[3], tonumber(s[4])
if writer and writer_end <= now then
  redis.call('HDEL', state, 'w', 'we', writer, owner_of(writer))
  writer = nil
end
if claim and claim_end <= now then
  redis.call('HDEL', state, 'ww', 'wwe')
  claim = nil
end
if writer == token or redis.call('ZSCORE', readers, token) then
  -- A retry of this acquisition whose granting reply was lost: the hold is ours (once), and
  -- its lease runs a full TTL from now, as the keeper dates it from this reply (never shorter
  -- than it was).
  local lease_end = now + tonumber(ARGV[2])
  if writer == token then
    if lease_end > writer_end then
      redis.call('HSET', state, 'we', integer(lease_end))
    end
  else
    redis.call('ZADD', readers, 'GT', lease_end, token)
    redis.call('PEXPIREAT', readers, lease_end, 'GT')
  end
  redis.call('PEXPIREAT', state, lease_end, 'GT')
  return {1, redis.call('HGET', state, token)}
end

local function first_reader_end()
  local first = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

if writer then
  return {0, writer_end - now}
end
if ARGV[3] == 'r' then
  if claim then
    return {0, claim_end - now}
  end
  if redis.call('ZCARD', readers) >= tonumber(ARGV[4]) then
    return {0, first_reader_end() - now}
  end
else
  if claim and claim ~= token then
    return {0, claim_end - now}
  end
  if redis.call('ZCARD', readers) > 0 then
    if ARGV[5] == '1' then
      redis.call('HSET', state, 'ww', token, 'wwe', integer(now + WAITER_TTL))
      redis.call('PEXPIREAT', state, now + WAITER_TTL, 'GT')
      redis.call('PEXPIREAT', state, now + WAITER_TTL, 'NX')
    end
    return {0, first_reader_end() - now}
  end
end

local fence = fence_after(redis.call('HGET', state, '#') or nil, now)
local lease_end = now + tonumber(ARGV[2])
if ARGV[3] == 'r' then
  redis.call('ZADD', readers, lease_end, token)
  redis.call('PEXPIREAT', readers, lease_end, 'GT')
  redis.call('PEXPIREAT', readers, lease_end, 'NX')
else
  redis.call('HSET', state, 'w', token, 'we', integer(lease_end))
  if claim == token then
    redis.call('HDEL', state, 'ww', 'wwe')
  end
end
redis.call('HSET', state, '#', fence, token, fence, owner_of(token), ARGV[6])
redis.call('PEXPIREAT', state, lease_end, 'GT')
redis.call('PEXPIREAT', state, lease_end, 'NX')
return {1, fence}
