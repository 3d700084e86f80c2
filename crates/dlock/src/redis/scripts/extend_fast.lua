-- The common extension, before common.lua's helpers are built: this hold's value, found by
-- its first fields. Anything else falls through to extend.lua. Same KEYS, ARGV and replies.
do
  local value = redis.call('GET', KEYS[1])
  local held = 'dlock1\0' .. ARGV[1] .. '\0' .. ARGV[2] .. '\0'
  if value and string.sub(value, 1, #held) == held then
    if ARGV[3] ~= '0' then
      redis.call('PEXPIRE', KEYS[1], ARGV[3], 'GT')
    end
    return 1
  end
end
