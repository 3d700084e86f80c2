-- KEYS: holders (zset of tokens scored by lease end), state (hash: fences, owners, a read-write
-- lock's writer and waiting writer)   ARGV: 'permits' | 'rwlock'
-- Returns {kind, token, fence, holds, owner, ms left, waiters} for the holder that has held
-- longest (the lowest fence), waiters '' when the store cannot tell (a semaphore keeps no
-- queue); {} when nobody holds.
local now = now_ms()
local holders, state = KEYS[1], KEYS[2]
local waiting = ''
if ARGV[1] == 'rwlock' then
  local s = redis.call('HMGET', state, 'w', 'we', 'ww', 'wwe')
  waiting = '0'
  if s[3] and tonumber(s[4]) > now then
    waiting = '1'
  end
  if s[1] and tonumber(s[2]) > now then
    local w = redis.call('HMGET', state, s[1], owner_of(s[1]))
    return {'writer', s[1], w[1], '1', w[2] or '', integer(tonumber(s[2]) - now), waiting}
  end
end
local live = '(' .. integer(now)
local count = redis.call('ZCOUNT', holders, live, '+inf')
if count == 0 then
  return {}
end
local tokens = redis.call('ZRANGEBYSCORE', holders, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1000)
local shown, shown_fence, shown_end
for i = 1, #tokens, 2 do
  local fence = redis.call('HGET', state, tokens[i])
  if fence and (not shown_fence or fence_below(fence, shown_fence)) then
    shown, shown_fence, shown_end = tokens[i], fence, tonumber(tokens[i + 1])
  end
end
if not shown then
  return {}
end
local kind = 'permit'
if ARGV[1] == 'rwlock' then
  kind = 'reader'
end
return {kind, shown, shown_fence, integer(count),
  redis.call('HGET', state, owner_of(shown)) or '', integer(shown_end - now), waiting}
