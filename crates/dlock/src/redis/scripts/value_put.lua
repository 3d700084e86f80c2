-- A versioned value: one hash {version, value} per name, key `<prefix>value:<name>`.
-- KEYS: value key. ARGV: condition ('any' | 'absent' | 'version'), expected version, bytes.
-- Returns the new version, or false when the condition does not hold (nothing written).
local current = redis.call('HGET', KEYS[1], 'version')
if ARGV[1] == 'absent' and current then
  return false
end
if ARGV[1] == 'version' and current ~= ARGV[2] then
  return false
end
local version = (tonumber(current) or 0) + 1
redis.call('HSET', KEYS[1], 'version', version, 'value', ARGV[3])
return version
