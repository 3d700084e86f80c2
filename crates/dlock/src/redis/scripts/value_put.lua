-- A versioned value: one hash {version, value} per name, key `<prefix>value:<name>`.
-- KEYS: value key. ARGV: condition ('any' | 'absent' | 'version'), expected version, bytes.
-- Returns the new version, or false when the condition does not hold (nothing written).
-- Runs after common.lua.
local current = redis.call('HGET', KEYS[1], 'version')
if ARGV[1] == 'absent' and current then
  return false
end
if ARGV[1] == 'version' and current ~= ARGV[2] then
  return false
end
-- Never below the clock floor (common.lua): a version given out before a partial data loss
-- (an older snapshot, a lagging replica) is never given out again for other bytes.
local version = fence_after(current, nil)
redis.call('HSET', KEYS[1], 'version', version, 'value', ARGV[3])
return version
