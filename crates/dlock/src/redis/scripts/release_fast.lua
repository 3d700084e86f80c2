-- The common release, before common.lua's helpers are built (building them is most of a short
-- script's cost): a single hold with nobody queued becomes free. Anything else (not this hold,
-- held more than once, queued, another layout) falls through to release.lua.
-- Same KEYS, ARGV and replies as release.lua.
do
  local value = redis.call('GET', KEYS[1])
  local held = 'dlock1\0' .. ARGV[1] .. '\0' .. ARGV[2] .. '\0' .. '1\0' .. '0\0'
  if value and string.sub(value, 1, #held) == held then
    -- The fence stays for the next holder; the owner of a free lock is never read.
    redis.call('SET', KEYS[1], 'dlock1\0\0' .. ARGV[2] .. '\0' .. '0\0' .. '0\0', 'KEEPTTL')
    return 0
  end
end
