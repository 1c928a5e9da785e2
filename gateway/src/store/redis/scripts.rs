//! The Lua scripts of the Redis store: each write that must check a
//! response's state before it changes it is one script over the
//! response's own keys (one Redis Cluster slot).

use std::sync::LazyLock;

/// The owner's write: object (optional) and events, unless terminal or gone.
/// KEYS: hash, events. ARGV: obj JSON or "", status, then seq/name/data triples.
/// Returns {0 written / 1 already terminal / -1 gone, then [`SETTLE`]'s
/// bucket and bytes}.
///
/// Idempotent: a write whose reply was lost (a client timeout while Redis
/// applied it) is retried by the owner, and the retry finds its own last
/// event (same id, same payload) already in the log, or, for an object
/// alone, the same object already stored: that is success, not a conflict.
pub(super) static WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if #ARGV >= 5 then
  local n = #ARGV - 2
  local landed = redis.call('XRANGE', KEYS[2], '0-' .. (tonumber(ARGV[n]) + 1), '0-' .. (tonumber(ARGV[n]) + 1))
  if #landed > 0 and landed[1][2][4] == ARGV[n + 2] then return {0, '', 0} end
elseif ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'obj') == ARGV[1] then
  return {0, '', 0}
end
if terminal(st) then return {1, '', 0} end
if redis.call('HEXISTS', KEYS[1], 'closing') == 1 then return {1, '', 0} end
if ARGV[1] ~= '' then redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2]) end
if #ARGV >= 5 then
  local bytes = 0
  for i = 3, #ARGV, 3 do
    redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[i]) + 1), 't', ARGV[i + 1], 'd', ARGV[i + 2])
    bytes = bytes + #ARGV[i + 1] + #ARGV[i + 2]
  end
  redis.call('HINCRBY', KEYS[1], 'ebytes', bytes)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
if ARGV[1] ~= '' and terminal(ARGV[2]) then return settle(0) end
return {0, '', 0}
"#,
    )
});

/// Lua shared by the scripts that may end a run: `terminal(status)`, and
/// `settle(code)`, which recounts a capped response (one with `qkey`) at
/// its full size (object, input items, conversation and the event log's
/// `ebytes`, each entry's name and payload, as `store::charged_at_end`
/// counts) and returns {code, its bucket, the bytes to add to the bucket}
/// ({code, '', 0} when nothing is to be added). The bucket is in another
/// slot, so the caller adds them ([`RedisStore::adjust`]).
pub(super) const SETTLE: &str = r#"
local function terminal(st)
  return st == 'completed' or st == 'failed' or st == 'cancelled' or st == 'incomplete'
end
local function settle(code)
  local q = redis.call('HMGET', KEYS[1], 'qkey', 'qbytes', 'ebytes')
  if not q[1] then return {code, '', 0} end
  local total = redis.call('HSTRLEN', KEYS[1], 'obj') + redis.call('HSTRLEN', KEYS[1], 'items')
    + redis.call('HSTRLEN', KEYS[1], 'ctx') + (tonumber(q[3]) or 0)
  local extra = total - (tonumber(q[2]) or 0)
  if extra <= 0 then return {code, '', 0} end
  redis.call('HSET', KEYS[1], 'qbytes', total)
  return {code, q[1], extra}
end
"#;

/// A script that may end a run, with [`SETTLE`]'s functions.
fn settling(body: &str) -> redis::Script {
    redis::Script::new(&format!("{SETTLE}{body}"))
}

/// A new response's hash and its time to live, in one step. KEYS: hash.
/// ARGV: time to live (ms), then field/value pairs.
pub(super) static STORE_NEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0
"#,
    )
});

/// Closes a running response's event log to its owner before an outside
/// terminal write (the owner's next WRITE answers "terminal"), so the log
/// read next is the whole log. KEYS: hash. Returns 0 closed (or already
/// closing), 1 already terminal, -1 gone.
/// A sweeper takes a handed-over run. KEYS: the hand-over key. ARGV: now
/// and the adopter's lease deadline (ms). Returns {2, record} when taken
/// (the key then reads `adopted:<until>`), {1} while an adopter that took
/// it has not renewed the lease yet, {0} when there is nothing to adopt.
pub(super) static TAKE_HANDOVER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local v = redis.call('GET', KEYS[1])
if not v then return {0} end
if string.sub(v, 1, 8) == 'adopted:' then
  if tonumber(string.sub(v, 9)) > tonumber(ARGV[1]) then return {1} end
  return {0}
end
redis.call('SET', KEYS[1], 'adopted:' .. ARGV[2], 'KEEPTTL')
return {2, v}
"#,
    )
});

pub(super) static CLOSE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return -1 end
if st == 'completed' or st == 'failed' or st == 'cancelled' or st == 'incomplete' then return 1 end
redis.call('HSET', KEYS[1], 'closing', '1')
return 0
"#,
    )
});

/// The owner's final write of a foreground response. KEYS: hash.
/// ARGV: obj JSON, status. Replaces a running status, or a terminal one
/// that a sweeper wrote (`swept`); a repeat of a landed write is success.
/// Returns {0 written / 1 already terminal / -1 gone, then [`SETTLE`]'s
/// bucket and bytes}.
pub(super) static FINISH: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if redis.call('HGET', KEYS[1], 'obj') == ARGV[1] then return {0, '', 0} end
if terminal(st) and redis.call('HGET', KEYS[1], 'swept') ~= '1' then return {1, '', 0} end
redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2])
redis.call('HDEL', KEYS[1], 'swept')
return settle(0)
"#,
    )
});

/// An outside terminal write (cancel, sweeper). KEYS: hash, events.
/// ARGV: obj JSON, status, "1" when a sweeper writes, then for a background
/// run its terminal event: sequence number, name, payload. The log was
/// closed to its owner before it was read, so the event's number is the
/// one after the log's last entry; the script checks that before it writes
/// anything (-2 if not), rather than append out of order. Returns {code,
/// then [`SETTLE`]'s bucket and bytes}.
pub(super) static TERMINATE: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if terminal(st) then return {1, '', 0} end
local event = #ARGV >= 6
if event then
  local seq = 0
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #last > 0 then seq = tonumber(string.match(last[1][1], '-(%d+)$')) end
  if seq ~= tonumber(ARGV[4]) then return {-2, '', 0} end
end
redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2])
redis.call('HDEL', KEYS[1], 'closing')
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'swept', '1') end
if event then
  redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[4]) + 1), 't', ARGV[5], 'd', ARGV[6])
  redis.call('HINCRBY', KEYS[1], 'ebytes', #ARGV[5] + #ARGV[6])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return settle(0)
"#,
    )
});

/// TERMINATE's answer when its event would not follow the log's last one.
pub(super) const OUT_OF_SEQUENCE: i64 = -2;

/// Deletes a response if it belongs to the org. KEYS: hash, events. ARGV: org.
/// Returns {deleted (0/1), its usage bucket or '', its counted bytes}.
pub(super) static DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('HGET', KEYS[1], 'org') ~= ARGV[1] then return {0, '', '0'} end
local q = redis.call('HMGET', KEYS[1], 'qkey', 'qbytes')
redis.call('DEL', KEYS[1], KEYS[2])
return {1, q[1] or '', q[2] or '0'}
"#,
    )
});

/// Adds a new response's bytes to its org's usage unless that passes the
/// cap. KEYS: the org's live buckets, the current one last. ARGV: bytes,
/// cap, the current bucket's time to live (ms). Returns {added (0/1), the
/// bytes counted before}.
pub(super) static CHARGE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local used = 0
for i = 1, #KEYS do
  used = used + math.max(0, tonumber(redis.call('GET', KEYS[i])) or 0)
end
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return {0, used} end
redis.call('INCRBY', KEYS[#KEYS], ARGV[1])
redis.call('PEXPIRE', KEYS[#KEYS], ARGV[3])
return {1, used}
"#,
    )
});

/// Adds bytes to a usage bucket (negative: gives them back), unless it
/// already expired (which gave back everything it counted). KEYS: bucket.
/// ARGV: bytes.
pub(super) static ADJUST: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('INCRBY', KEYS[1], ARGV[1])
"#,
    )
});
