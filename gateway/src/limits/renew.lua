-- Renew: the heartbeat of one replica's concurrency slots in one in-flight
-- set. Each slot it still holds lapses one lease from now (Redis's clock,
-- as in admit.lua); a slot already settled or lapsed stays gone, so a late
-- renewal never brings back a slot another request has taken.
--
-- KEYS[1] in flight   zset  member = request id, score = lapse ms
-- ARGV: lease ms, request ids...
--
-- Returns how many slots were renewed.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 and redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return renewed
