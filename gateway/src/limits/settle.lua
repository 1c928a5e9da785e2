-- Settle: the end of an admitted request (finished, failed or cancelled).
-- Releases its concurrency slot, replaces its token reservation by what it
-- really used, and adds its usage and cost to the organisation's daily
-- counters and spend. One round trip; all keys share the org's hash tag.
--
-- KEYS[1] token log   KEYS[2] token sum   KEYS[3] in flight
-- KEYS[4] org spend   KEYS[5] usage hash of the day
-- KEYS[6] this request's settled marker
-- ARGV: request id, reserved tokens (0 = not tracked), actual tokens,
--       window ms, usage field prefix ("<key id>|<model>|"),
--       requests, input, cached input, output, reasoning, cost nano,
--       usage ttl seconds
--
-- Idempotent: a settlement whose reply was lost is retried, and a retry of
-- one that landed finds the marker and changes nothing (returns 0).

if not redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[4]) then
  return 0
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local reserved = tonumber(ARGV[2])
local actual = tonumber(ARGV[3])
local window = tonumber(ARGV[4])

redis.call('ZREM', KEYS[3], rid)

if reserved > 0 then
  local member = rid .. ':' .. reserved
  local score = redis.call('ZSCORE', KEYS[1], member)
  if score then
    -- Still in the window: it counts at its admission time, at its real size.
    redis.call('ZREM', KEYS[1], member)
    if actual > 0 then
      redis.call('ZADD', KEYS[1], score, rid .. ':' .. actual)
    end
    redis.call('INCRBY', KEYS[2], actual - reserved)
  elseif actual > reserved then
    -- The reservation already left the window (a long stream): what it
    -- used beyond it counts now.
    redis.call('ZADD', KEYS[1], now, rid .. ':x:' .. (actual - reserved))
    redis.call('INCRBY', KEYS[2], actual - reserved)
  end
  if redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('PEXPIRE', KEYS[1], window)
    redis.call('PEXPIRE', KEYS[2], window)
  end
end

local prefix = ARGV[5]
local names = {'requests', 'input', 'cached_input', 'output', 'reasoning', 'cost_nano'}
local any = false
for i = 1, 6 do
  local n = tonumber(ARGV[5 + i])
  if n > 0 then
    redis.call('HINCRBY', KEYS[5], prefix .. names[i], n)
    any = true
  end
end
if any then
  redis.call('EXPIRE', KEYS[5], tonumber(ARGV[12]))
end
local cost = tonumber(ARGV[11])
if cost > 0 then
  redis.call('INCRBY', KEYS[4], cost)
end
return 1
