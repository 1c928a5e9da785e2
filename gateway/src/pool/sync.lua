-- One replica's sync of one pool's order (pool/peers.rs), one round trip.
-- KEYS[1]: the pool's state hash (replica id -> "<expiry ms>|<entry>")
-- KEYS[2]: the pool's shared virtual counters (organisation -> counter)
-- ARGV[1]: this replica's id; ARGV[2]: its entry's lifetime (ms)
-- ARGV[3]: its entry; ARGV[4]: channel to nudge its peers on, or ""
-- ARGV[5]: the counters' lifetime (ms) when it has active organisations, or 0
-- ARGV[6..]: (organisation, increment, floor) triples
-- Returns {peers' live (id, entry) pairs, flat; the triples' counters after
-- the update}.
-- The clock is Redis's own, so replicas' clocks need not agree.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], (now + ttl) .. '|' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local peers = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  if id ~= ARGV[1] then
    local sep = string.find(v, '|', 1, true)
    local expiry = sep and tonumber(string.sub(v, 1, sep - 1))
    if expiry == nil or expiry < now then
      -- A replica that stopped renewing (dead, cut off): its slots and
      -- waiters no longer count.
      redis.call('HDEL', KEYS[1], id)
    else
      peers[#peers + 1] = id
      peers[#peers + 1] = string.sub(v, sep + 1)
    end
  end
end
local counters = {}
for i = 6, #ARGV, 3 do
  local org = ARGV[i]
  local incr = tonumber(ARGV[i + 1])
  local floor = tonumber(ARGV[i + 2])
  local cur = tonumber(redis.call('HGET', KEYS[2], org) or '0')
  local next = math.max(cur, floor) + incr
  if next ~= cur then
    redis.call('HSET', KEYS[2], org, tostring(next))
  end
  counters[#counters + 1] = tostring(next)
end
local keep = tonumber(ARGV[5])
if keep > 0 then
  redis.call('PEXPIRE', KEYS[2], keep)
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[1])
end
return {peers, counters}
