-- Takes several free locks in one step, all or none (a multi-lock's attempt; no waiting, no
-- reentry, no queue entry).
-- KEYS: lock, queue, qexp of each lock, in the multi-lock's canonical order.
-- ARGV: ttl_ms, owner, then each lock's token.
-- Returns {1, fence, fence, …} when granted, {0, index, free_in_ms} at the first busy lock.
local ttl, owner = ARGV[1], ARGV[2]
local count = #KEYS / 3
local now = nil
local taken = {}
for i = 1, count do
  local key, queue_key = KEYS[3 * i - 2], KEYS[3 * i - 1]
  local holder, fence, holds, queued = read(key)
  if holder == false then
    return fence
  end
  if holder and holder ~= '' then
    return {0, i, redis.call('PTTL', key)}
  end
  local still_queued = '0'
  if queued == '1' or (not holder and redis.call('EXISTS', queue_key) == 1) then
    -- Someone waits for this lock on its own: as an unfair acquire, leave it to a waiter that
    -- has waited past the starvation guard.
    local q = queue(queue_key, KEYS[3 * i])
    now = now or now_ms()
    local head, since = q.head(now)
    if head and now - since >= STARVATION then
      return {0, i, q.expiry(head) - now}
    end
    if q.exists() then
      still_queued = '1'
    end
  end
  taken[i] = {holder, fence, still_queued}
end
local reply = {1}
for i = 1, count do
  local holder, fence, still_queued = taken[i][1], taken[i][2], taken[i][3]
  now = now or now_ms()
  local next_fence = fence_after(holder and fence or nil, now)
  redis.call('SET', KEYS[3 * i - 2], encode(ARGV[2 + i], next_fence, 1, still_queued, owner), 'PX', ttl)
  reply[i + 1] = next_fence
end
return reply
