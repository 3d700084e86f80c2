-- The common acquire, before common.lua's helpers are built (building them is most of a short
-- script's cost): a lock that is free with nobody queued, or gone with no queue left. Anything
-- else (held, queued, a fence near 2^53, another layout) falls through to acquire.lua.
-- Same KEYS, ARGV and replies as acquire.lua.
do
  local value = redis.call('GET', KEYS[1])
  local last
  if value then
    -- Free (empty token), holds 0, queued '0': what release.lua leaves when nobody waits.
    last = string.match(value, '^dlock1%z%z(%d+)%z0%z0%z')
  end
  if ARGV[6] ~= '1' and ((last and tonumber(last) < 9007199254740990)
      or (not value and redis.call('EXISTS', KEYS[2]) == 0)) then
    local t = redis.call('TIME')
    local fence = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1024
    if last and tonumber(last) >= fence then
      fence = tonumber(last) + 1
    end
    fence = string.format('%d', fence)
    redis.call('SET', KEYS[1], 'dlock1\0' .. ARGV[1] .. '\0' .. fence .. '\0' .. '1\0' .. '0\0'
      .. ARGV[7], 'PX', ARGV[2])
    return {1, fence, 0}
  end
end
