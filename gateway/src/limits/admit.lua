-- Admission: checks budget, concurrency, requests per minute and tokens per
-- minute of one organisation and model together, and records the request
-- only if all pass. One round trip; atomic, so the counts are exact across
-- replicas. Time comes from Redis (one clock for every replica).
--
-- Windows are sliding logs: a sorted set of entries scored by admission
-- time in ms, so "per minute" means any 60 s, not a calendar minute.
--
-- KEYS[1] request log   zset  member = request id, score = admitted ms
-- KEYS[2] token log     zset  member = "<request id>:<tokens>", score = ms
-- KEYS[3] token sum     string (sum of the token log's tokens)
-- KEYS[4] in flight     zset  member = request id, score = when the slot
--                             lapses (ms) unless its replica renews it
--                             (renew.lua)
-- KEYS[5] org spend     string (nano-dollars)
-- ARGV: request id, rpm, tpm, max concurrent, tokens, slot lease ms,
--       budget nano (-1 = none), window ms, renewal period ms,
--       taken over (1: admitted on another replica and taken over here, a
--       handed-over background run: recorded, never refused, and not
--       counted again in the request log)
--       (limits: 0 = unlimited)
--
-- Returns {verdict, used requests, used tokens, reset requests ms,
--          reset tokens ms, retry after ms}; verdict 0 admitted,
--          1 requests, 2 tokens, 3 concurrency, 4 budget.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local rpm = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
local maxc = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local budget = tonumber(ARGV[7])
local window = tonumber(ARGV[8])
local renew = tonumber(ARGV[9])
local taken_over = tonumber(ARGV[10]) == 1
local edge = now - window

-- Forget what left the windows.
local used_req = 0
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', edge)
  used_req = redis.call('ZCARD', KEYS[1])
end
local used_tok = 0
if tpm > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', edge)
  if #old > 0 then
    local freed = 0
    for i = 1, #old do
      freed = freed + (tonumber(string.match(old[i], ':(%d+)$')) or 0)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', edge)
    redis.call('DECRBY', KEYS[3], freed)
  end
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[3])
  end
  used_tok = tonumber(redis.call('GET', KEYS[3]) or '0')
end
local inflight = 0
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[4])
end

local verdict = 0
local retry = 0
if taken_over then
  -- Admitted once already: refusing it now would lose promised work.
  verdict = 0
elseif budget >= 0 and tonumber(redis.call('GET', KEYS[5]) or '0') >= budget then
  verdict = 4
elseif maxc > 0 and inflight >= maxc then
  verdict = 3
  -- The slot that lapses first: written more than two renewals ago, its
  -- owner is presumed dead and it frees when it lapses; else every owner
  -- is alive and a slot may free any moment (a 1 s hint). As
  -- limits/slots.rs::concurrency_retry_ms.
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  local lapse = tonumber(first[2]) - now
  if ttl - lapse > 2 * renew then
    retry = lapse
  else
    retry = math.min(lapse, 1000)
  end
elseif rpm > 0 and used_req >= rpm then
  verdict = 1
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  retry = tonumber(oldest[2]) + window - now
elseif tpm > 0 and used_tok + tokens > tpm then
  verdict = 2
  if tokens > tpm then
    retry = window
  else
    -- When enough of the oldest entries leave the window to fit this one.
    local need = used_tok + tokens - tpm
    local entries = redis.call('ZRANGE', KEYS[2], 0, 199, 'WITHSCORES')
    retry = window
    local freed = 0
    for i = 1, #entries, 2 do
      freed = freed + (tonumber(string.match(entries[i], ':(%d+)$')) or 0)
      if freed >= need then
        retry = tonumber(entries[i + 1]) + window - now
        break
      end
    end
  end
end

if verdict == 0 then
  if rpm > 0 and not taken_over then
    redis.call('ZADD', KEYS[1], now, rid)
    redis.call('PEXPIRE', KEYS[1], window)
    used_req = used_req + 1
  end
  if tpm > 0 then
    redis.call('ZADD', KEYS[2], now, rid .. ':' .. tokens)
    redis.call('INCRBY', KEYS[3], tokens)
    redis.call('PEXPIRE', KEYS[2], window)
    redis.call('PEXPIRE', KEYS[3], window)
    used_tok = used_tok + tokens
  end
  if maxc > 0 then
    redis.call('ZADD', KEYS[4], now + ttl, rid)
    -- Never shorter than a slot it holds (leases may differ by replica).
    if redis.call('PTTL', KEYS[4]) < ttl then
      redis.call('PEXPIRE', KEYS[4], ttl)
    end
  end
end

-- Time until each window is back to its full allowance.
local reset_req = 0
if rpm > 0 and used_req > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if newest[2] then reset_req = tonumber(newest[2]) + window - now end
end
local reset_tok = 0
if tpm > 0 and used_tok > 0 then
  local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if newest[2] then reset_tok = tonumber(newest[2]) + window - now end
end
return {verdict, used_req, used_tok, reset_req, reset_tok, retry}
