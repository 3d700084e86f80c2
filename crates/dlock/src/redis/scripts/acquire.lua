-- KEYS: lock, queue, qexp
-- ARGV: token, ttl_ms, reentrant, fair, waits, queued (an earlier attempt of this call put it
--       in the queue), owner (at, host, pid, label joined by NUL)
-- Returns {1, fence, reentered} when granted, {0, free_in_ms} when busy (-1: unknown).
-- The common case (a free lock that was used before) is two commands: GET and SET.
local key, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local holder, fence, holds, queued, owner = read(key)
if holder == false then
  return fence
end

if holder and holder ~= '' then
  if holder == token then
    if ARGV[3] == '1' then
      -- A re-entry through the guard: one more hold.
      redis.call('SET', key, encode(holder, fence, holds + 1, queued, owner), 'KEEPTTL')
      redis.call('PEXPIRE', key, ttl, 'GT')
      return {1, fence, 1}
    end
    -- A retry of this acquisition whose granting reply was lost: the grant is ours.
    redis.call('PEXPIRE', key, ttl, 'GT')
    return {1, fence, 0}
  end
  if ARGV[5] == '1' then
    queue(KEYS[2], KEYS[3]).join(token, now_ms())
    if queued ~= '1' then
      redis.call('SET', key, encode(holder, fence, holds, '1', owner), 'KEEPTTL')
    end
  end
  return {0, redis.call('PTTL', key)}
end

-- Free. Without a lock value the queue flag is unknown: look at the queue itself.
local q = nil
if queued == '1' or (not holder and redis.call('EXISTS', KEYS[2]) == 1) then
  q = queue(KEYS[2], KEYS[3])
  local now = now_ms()
  local head, since = q.head(now)
  if head and head ~= token and (ARGV[4] == '1' or now - since >= STARVATION) then
    if ARGV[5] == '1' then
      q.join(token, now)
      if holder and queued ~= '1' then
        redis.call('SET', key, encode(holder, fence, holds, '1', owner), 'KEEPTTL')
      end
    end
    return {0, q.expiry(head) - now}
  end
  if ARGV[6] == '1' then
    q.leave(token)
  end
end

-- The fence continues from the last holder's, or from the clock floor when that is higher
-- (the value is gone, or came back older than fences already given out).
local next_fence = fence_after(holder and fence or nil)
local still_queued = '0'
if q and q.exists() then
  still_queued = '1'
end
redis.call('SET', key, encode(token, next_fence, 1, still_queued, ARGV[7]), 'PX', ttl)
return {1, next_fence, 0}
