//! The Lua scripts every operation runs on the server, as one atomic step each.

use super::*;

/// The scripts. Each reads the server's clock with `TIME` before it writes; on Redis < 5 that
/// needs `redis.replicate_commands()` (a no-op since Redis 5, deprecated in 7).
pub(super) struct Scripts {
    pub(super) reserve: Script,
    pub(super) get: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) mark_unknown: Script,
    pub(super) take_over: Script,
    pub(super) purge: Script,
    pub(super) list: Script,
    pub(super) resolve: Script,
}

/// Shared by every script: the server's clock in milliseconds, and the record read as the fields
/// in [`parse_read`]'s order (`nil` for no record, `false` for a key that is not a hash).
pub(super) const PRELUDE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(n) return string.format('%d', n) end
local function load(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return nil end
  if kind ~= 'hash' then return false end
  return redis.call('HMGET', key, 'state', 'token', 'fp', 'since', 'lease_until', 'outcome', 'completed_at', 'expires_at', 'tool')
end
local function reply(now, r)
  return {'record', ms(now), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]}
end
local function stale(r, now)
  local lease_until = tonumber(r[5])
  return r[1] == 'unknown' or (r[1] == 'in_progress' and lease_until ~= nil and lease_until <= now)
end
local function expired(r, now)
  local at = tonumber(r[8])
  return r[1] == 'completed' and at ~= nil and at <= now
end
local function absent(r, now)
  return r[1] == 'not_done' or expired(r, now)
end
local function held(r, token)
  return r and (r[1] == 'in_progress' or r[1] == 'not_done') and r[2] == token
end
"#;

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
    Scripts {
        // KEYS[1] record, KEYS[2] its failure counter; ARGV token, fingerprint, lease ms, tool.
        // A reserve sent again under its token (a cluster client resends a request whose
        // connection dropped, and the first may have been applied) finds its own reservation,
        // and is answered as the first would have been.
        reserve: script(
            r#"
local r = load(KEYS[1])
if r == false then return {'corrupt', 'the key holds something other than a hash'} end
local now = now_ms()
if r and r[1] == 'in_progress' and r[2] == ARGV[1] then
  return {'reserved', redis.call('GET', KEYS[2]) or '0'}
end
if r then
  if not absent(r, now) then return reply(now, r) end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'token', ARGV[1], 'fp', ARGV[2],
  'since', ms(now), 'lease_until', ms(now + tonumber(ARGV[3])), 'tool', ARGV[4])
return {'reserved', redis.call('GET', KEYS[2]) or '0'}
"#,
        ),
        // KEYS[1] record.
        get: script(
            r#"
local r = load(KEYS[1])
if r == false then return {'corrupt', 'the key holds something other than a hash'} end
if r == nil then return {'absent'} end
return reply(now_ms(), r)
"#,
        ),
        // KEYS[1] record; ARGV token, outcome, retain ms, TTL margin ms. Sent again after a lost
        // answer, it finds the record it completed and answers as the first did.
        complete: script(
            r#"
local r = load(KEYS[1])
if not held(r, ARGV[1]) then
  if r and r[1] == 'completed' and r[2] == ARGV[1] and r[6] == ARGV[2] then return 1 end
  return 0
end
local now = now_ms()
local retain = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'completed', 'outcome', ARGV[2],
  'completed_at', ms(now), 'expires_at', ms(now + retain))
redis.call('PEXPIRE', KEYS[1], ms(retain + tonumber(ARGV[4])))
return 1
"#,
        ),
        // KEYS[1] record; ARGV token.
        release: script(
            r#"
if not held(load(KEYS[1]), ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#,
        ),
        // KEYS[1] record; ARGV token, lease ms.
        renew: script(
            r#"
if not held(load(KEYS[1]), ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'lease_until', ms(now_ms() + tonumber(ARGV[2])))
return 1
"#,
        ),
        // KEYS[1] record; ARGV token.
        mark_unknown: script(
            r#"
if not held(load(KEYS[1]), ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'unknown')
return 1
"#,
        ),
        // KEYS[1] record; ARGV stale token, new token, lease ms.
        take_over: script(
            r#"
local r = load(KEYS[1])
if not r or r[2] ~= ARGV[1] then return 0 end
local now = now_ms()
if stale(r, now) then
  redis.call('HSET', KEYS[1], 'state', 'in_progress', 'token', ARGV[2],
    'since', ms(now), 'lease_until', ms(now + tonumber(ARGV[3])))
  return 1
end
return 0
"#,
        ),
        // KEYS: records found by SCAN.
        purge: script(
            r#"
local now = now_ms()
local n = 0
for _, key in ipairs(KEYS) do
  local r = load(key)
  if r and expired(r, now) then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"#,
        ),
        // KEYS: records found by SCAN. One reply per key: the record, or `{'skip'}` for a key
        // that is gone or not a hash.
        list: script(
            r#"
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local r = load(key)
  if r then out[i] = reply(now, r) else out[i] = {'skip'} end
end
return out
"#,
        ),
        // KEYS[1] record; ARGV seen token, 'done' or 'not_done', outcome, retain ms, TTL margin
        // ms.
        resolve: script(
            r#"
local r = load(KEYS[1])
if not r or r[2] ~= ARGV[1] then return 0 end
local now = now_ms()
if not stale(r, now) then return 0 end
if ARGV[2] == 'not_done' then
  redis.call('HSET', KEYS[1], 'state', 'not_done')
  return 1
end
local retain = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'completed', 'outcome', ARGV[3],
  'completed_at', ms(now), 'expires_at', ms(now + retain))
redis.call('PEXPIRE', KEYS[1], ms(retain + tonumber(ARGV[5])))
return 1
"#,
        ),
    }
});

/// Counts a failure: the first opens the window (a TTL on the server's clock), later ones add
/// to the count; a counter that somehow has no TTL gets one, so none outlives its window by
/// more than one. KEYS[1] counter; ARGV window ms.
pub(super) static COUNT_FAILURE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local n = redis.call('INCR', KEYS[1])
if n == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
"#,
    )
});
