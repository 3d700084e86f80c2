-- KEYS: the lock of each lease   ARGV: token, fence, ttl_ms of each lease, in KEYS' order
-- extend.lua for every lease at once (the renewals that arrive together, one round trip).
-- Returns one answer per lease: 1 when owned (and extended unless its ttl is 0), 0 when not,
-- -1 for a value that is not a lock (the caller asks extend.lua alone, for its error).
local answers = {}
for i, key in ipairs(KEYS) do
  local token, fence, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local holder, found = read(key)
  if holder == false then
    answers[i] = -1
  elseif holder ~= token or found ~= fence then
    answers[i] = 0
  else
    if ttl ~= '0' then
      redis.call('PEXPIRE', key, ttl, 'GT')
    end
    answers[i] = 1
  end
end
return answers
