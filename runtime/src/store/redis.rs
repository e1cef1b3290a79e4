//! The Redis store: one hash per record, every transition one Lua script on the server's clock.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use super::row::{span_ms, StoredRecord};
use super::{
    from_millis, Cursor, Filter, Outcome, Page, Record, RecordKey, Reservation, Resolution, Store,
    StoreError, Token,
};
use crate::Fingerprint;

/// How long a completed record stays in Redis after its retention: the TTL only frees memory,
/// expiry itself is checked against `expires_at` at read time. The margin lets
/// [`Store::purge_expired`] find what expired recently, and keeps a record whose TTL the server
/// judges a little early from vanishing before it is expired by `expires_at`.
const TTL_MARGIN: Duration = Duration::from_secs(60);

/// How many slots one `SCAN` step of [`Store::purge_expired`] visits, and the most one step of
/// [`Store::list`] widens to.
const SCAN_COUNT: usize = 500;

/// The most `SCAN` steps one page of [`Store::list`] takes looking for records.
const SCAN_STEPS_PER_PAGE: usize = 64;

/// The schema version this build writes, kept in the key `<prefix>.version`. Version 1 (no such
/// key) kept no `tool` field; its records read as they are, with their tool unknown.
const SCHEMA_VERSION: i64 = 2;

/// Keeps each record in a Redis hash, and changes it only in Lua scripts that read the record
/// and the server's clock (`TIME`) and write in one atomic step, so workers with skewed clocks
/// agree and no transition is a read followed by a separate write. `reserve` reads the record and
/// replaces it only if it is absent or completed and expired; the fenced operations compare the
/// token inside the script.
///
/// A completed record gets a TTL of its retention plus a minute, so Redis frees it without a
/// sweeper; whether it is still replayed is decided by the `expires_at` kept in the record and
/// checked at read time. In-progress and unknown records have no TTL: a reservation that vanished
/// would let a retry run the work a second time.
///
/// Keys are `<prefix>:<tenant>:<key>`, with `\` and `:` inside the tenant and key escaped by a
/// `\`, so no tenant or key can spell another's. The prefix is `toolkey` unless
/// [`RedisStoreBuilder::prefix`] says otherwise. The failure counters of retry limits are
/// `<prefix>\failures:<tenant>:<key>`, each with a TTL of its window.
///
/// # What the server must be configured for
///
/// - **No eviction.** Under a `maxmemory-policy` other than `noeviction`, Redis may delete
///   records when memory is short: `allkeys-*` any of them (an in-progress reservation too: a
///   retry then runs the work again), `volatile-*` the completed ones (which have TTLs: a retry
///   then runs again instead of replaying). [`RedisStoreBuilder::connect`] reads the policy and
///   logs a `tracing` warning for anything but `noeviction`.
/// - **Persistence**, if records must survive a restart of Redis: with neither AOF nor RDB a
///   restarted server has forgotten every reservation.
/// - **One primary.** Replication is asynchronous: a reservation acknowledged by a primary that
///   fails before its replica has it is lost on failover. Redis Cluster is not supported.
///
/// The store talks over a [`ConnectionManager`]: one multiplexed connection that reconnects after
/// it breaks. The call that meets the broken connection fails with [`StoreError::Unavailable`],
/// and so does every call while the server cannot be reached; then calls succeed again.
///
/// ```no_run
/// use toolkey::store::RedisStore;
///
/// # async fn run() -> Result<(), toolkey::store::StoreError> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let shared = RedisStore::builder("redis://cache.internal:6379/2")
///     .prefix("billing-agent")
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    eviction_policy: Option<String>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("eviction_policy", &self.eviction_policy)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RedisStore`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password.
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host[:port][/db]`) with the
    /// defaults: prefix `toolkey`, 5 s timeouts. The server must answer: an unreachable one is
    /// [`StoreError::Unavailable`].
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// A builder for a store connecting to `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: "toolkey".into(),
            timeout: Duration::from_secs(5),
        }
    }

    /// The server's `maxmemory-policy` as read on connect, if the server let it be read.
    pub fn eviction_policy(&self) -> Option<&str> {
        self.eviction_policy.as_deref()
    }

    /// The Redis key of a record.
    fn redis_key(&self, key: &RecordKey) -> String {
        escaped(&self.prefix, "", key)
    }

    /// The Redis key of a failure counter: `<prefix>\failures:<tenant>:<key>`. No record key
    /// can spell it (a record key's first `\` escapes a `\` or a `:`, and the prefix has none),
    /// and `SCAN <prefix>:*` never meets it.
    fn failures_key(&self, key: &RecordKey) -> String {
        escaped(&self.prefix, FAILURES, key)
    }

    /// The record key a Redis key of this store's spells, or `None` for a key that is not one
    /// of its records.
    fn record_key(&self, redis_key: &[u8]) -> Option<RecordKey> {
        let text = std::str::from_utf8(redis_key).ok()?;
        let rest = text.strip_prefix(self.prefix.as_str())?.strip_prefix(':')?;
        let (mut parts, mut part, mut escaped) = (Vec::new(), String::new(), false);
        for c in rest.chars() {
            match c {
                _ if escaped => {
                    part.push(c);
                    escaped = false;
                }
                '\\' => escaped = true,
                ':' => parts.push(std::mem::take(&mut part)),
                _ => part.push(c),
            }
        }
        parts.push(part);
        match <[String; 2]>::try_from(parts) {
            Ok([tenant, key]) if !escaped => Some(RecordKey::new(tenant, key)),
            _ => None,
        }
    }

    /// The `SCAN MATCH` pattern of this store's records (of one tenant's, if given).
    fn pattern(&self, tenant: Option<&str>) -> String {
        match tenant {
            Some(tenant) => {
                let spelled = self.redis_key(&RecordKey::new(tenant, ""));
                format!("{}*", glob_escape(&spelled))
            }
            None => format!("{}:*", glob_escape(&self.prefix)),
        }
    }

    /// Reads a record and the server's clock in one step; `None` when there is no record.
    async fn read(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&str],
    ) -> Result<Read, StoreError> {
        self.read_from(script.key(self.redis_key(key)), key, args)
            .await
    }

    /// Runs a reading script prepared with its keys.
    async fn read_from(
        &self,
        mut invocation: redis::ScriptInvocation<'_>,
        key: &RecordKey,
        args: &[&str],
    ) -> Result<Read, StoreError> {
        for arg in args {
            invocation.arg(*arg);
        }
        let reply: Vec<Option<Vec<u8>>> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        parse_read(key, reply)
    }

    /// Runs a fenced script: true when it changed the record.
    async fn fenced(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&str],
    ) -> Result<bool, StoreError> {
        let mut invocation = script.key(self.redis_key(key));
        for arg in args {
            invocation.arg(*arg);
        }
        let changed: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(changed == 1)
    }

    /// Overwrites a record's stored outcome with text that is not an outcome, as disk or a
    /// careless migration might. For the conformance suite's corruption check.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn __corrupt(&self, key: &RecordKey) {
        redis::cmd("HSET")
            .arg(self.redis_key(key))
            .arg("outcome")
            .arg("{not json")
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .expect("corrupt a record");
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key the store writes. Default `toolkey`. Not empty, no `\`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long connecting, and then each call, may take before it is
    /// [`StoreError::Unavailable`]. Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects, and reads the server's `maxmemory-policy` (see [`RedisStore`] on eviction).
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        if self.prefix.is_empty() || self.prefix.contains('\\') {
            return Err(StoreError::Config(format!(
                "redis: invalid key prefix {:?}: it must be non-empty and without `\\`",
                self.prefix
            )));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| StoreError::Config(format!("redis: bad connection URL: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            // Reconnecting retries a little, then fails the waiting calls: a store that cannot
            // reach its server must answer Unavailable soon, not queue calls.
            .set_number_of_retries(2);
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(unavailable)?;
        check_version(&mut conn, &self.prefix).await?;
        let eviction_policy = read_eviction_policy(&mut conn).await?;
        match eviction_policy.as_deref() {
            Some(policy) => {
                if let Some(risk) = eviction_risk(policy) {
                    tracing::warn!(
                        maxmemory_policy = policy,
                        "Redis may evict toolkey records: {risk}; set maxmemory-policy to noeviction"
                    );
                }
            }
            None => tracing::warn!(
                "could not read Redis's maxmemory-policy (CONFIG GET refused); make sure it is \
                 noeviction, or Redis may delete toolkey records when memory is short"
            ),
        }
        Ok(RedisStore {
            conn,
            prefix: self.prefix,
            eviction_policy,
        })
    }
}

/// Records the schema version under the prefix, or refuses records written by a newer toolkey.
async fn check_version(conn: &mut ConnectionManager, prefix: &str) -> Result<(), StoreError> {
    let key = format!("{prefix}.version");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(SCHEMA_VERSION)
        .arg("NX")
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    let found: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    match found.as_deref().map(str::parse::<i64>) {
        // Version 1 kept no version key: setting it is the whole migration.
        Some(Ok(version)) if version <= SCHEMA_VERSION => Ok(()),
        other => Err(StoreError::Config(format!(
            "redis: prefix {prefix:?} has schema version {}, this toolkey knows version \
             {SCHEMA_VERSION}: it was written by a newer toolkey",
            match other {
                Some(Ok(v)) => v.to_string(),
                _ => format!("{found:?}"),
            }
        ))),
    }
}

/// The server's `maxmemory-policy`, or `None` when the server refuses `CONFIG GET` (managed
/// services often do). A connection failure is an error.
async fn read_eviction_policy(conn: &mut ConnectionManager) -> Result<Option<String>, StoreError> {
    let reply: Result<HashMap<String, String>, RedisError> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    match reply {
        Ok(mut config) => Ok(config.remove("maxmemory-policy")),
        Err(e)
            if e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal() =>
        {
            Err(unavailable(e))
        }
        Err(_) => Ok(None),
    }
}

/// What a `maxmemory-policy` may do to records, or `None` when it never evicts.
fn eviction_risk(policy: &str) -> Option<&'static str> {
    if policy == "noeviction" {
        None
    } else if policy.starts_with("volatile-") {
        Some("completed records have TTLs and may be evicted before their retention ends, so a retry would run again")
    } else {
        Some(
            "any record may be evicted, an in-progress reservation too, so a retry would run again",
        )
    }
}

/// What follows the prefix in a failure counter's key.
const FAILURES: &str = "\\failures";

/// `<prefix><kind>:<tenant>:<key>`, with `\` and `:` inside the tenant and key escaped.
fn escaped(prefix: &str, kind: &str, key: &RecordKey) -> String {
    let mut out =
        String::with_capacity(prefix.len() + kind.len() + key.tenant.len() + key.key.len() + 2);
    out.push_str(prefix);
    out.push_str(kind);
    for part in [&key.tenant, &key.key] {
        out.push(':');
        for c in part.chars() {
            if c == '\\' || c == ':' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

/// What a reading script found.
enum Read {
    Absent,
    /// Reserved, with the key's failure count.
    Reserved(u64),
    Found(StoredRecord, i64),
}

/// Reads a script's reply: `["reserved", failures]`, `["absent"]`, `["corrupt", why]` or
/// `["record", now, state, token, fp, since, lease_until, outcome, completed_at, expires_at,
/// tool]`.
fn parse_read(key: &RecordKey, reply: Vec<Option<Vec<u8>>>) -> Result<Read, StoreError> {
    let corrupt = |why: &str| StoreError::corrupt(key, why.to_string());
    let mut fields = reply.into_iter().map(|field| {
        field
            .map(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|_| StoreError::corrupt(key, "a field is not UTF-8"))
            })
            .transpose()
    });
    let mut next = || fields.next().unwrap_or(Ok(None));
    let tag = next()?.unwrap_or_default();
    match tag.as_str() {
        "absent" => return Ok(Read::Absent),
        "reserved" => {
            let failures = next()?.unwrap_or_default();
            return failures
                .parse::<i64>()
                .map(|n| Read::Reserved(n.max(0) as u64))
                .map_err(|_| corrupt(&format!("the failure count is not a number: {failures:?}")));
        }
        "corrupt" => return Err(corrupt(&next()?.unwrap_or_default())),
        "record" => {}
        other => {
            return Err(StoreError::Unavailable(format!(
                "redis: unexpected script reply {other:?}"
            )))
        }
    }
    let int = |text: Option<String>, what: &str| -> Result<Option<i64>, StoreError> {
        text.map(|t| {
            t.parse::<i64>()
                .map_err(|_| corrupt(&format!("{what} is not a number: {t:?}")))
        })
        .transpose()
    };
    let now = int(next()?, "the server's time")?.ok_or_else(|| corrupt("no server time"))?;
    let state = next()?.ok_or_else(|| corrupt("state is missing"))?;
    let token = next()?.ok_or_else(|| corrupt("token is missing"))?;
    let fingerprint = next()?.ok_or_else(|| corrupt("fingerprint is missing"))?;
    let since_ms = int(next()?, "since")?.ok_or_else(|| corrupt("since is missing"))?;
    let lease_until_ms =
        int(next()?, "lease_until")?.ok_or_else(|| corrupt("lease_until is missing"))?;
    let outcome = next()?;
    let completed_at_ms = int(next()?, "completed_at")?;
    let expires_at_ms = int(next()?, "expires_at")?;
    let tool = next()?;
    let stored = StoredRecord {
        tool,
        state,
        token,
        fingerprint,
        since_ms,
        lease_until_ms,
        outcome,
        completed_at_ms,
        expires_at_ms,
    };
    Ok(Read::Found(stored, now))
}

/// The scripts. Each reads the server's clock with `TIME` before it writes; on Redis < 5 that
/// needs `redis.replicate_commands()` (a no-op since Redis 5, deprecated in 7).
struct Scripts {
    reserve: Script,
    get: Script,
    complete: Script,
    release: Script,
    renew: Script,
    mark_unknown: Script,
    take_over: Script,
    purge: Script,
    list: Script,
    resolve: Script,
}

/// Shared by every script: the server's clock in milliseconds, and the record read as the fields
/// in [`parse_read`]'s order (`nil` for no record, `false` for a key that is not a hash).
const PRELUDE: &str = r#"
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
local function held(r, token)
  return r and r[1] == 'in_progress' and r[2] == token
end
"#;

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
    Scripts {
        // KEYS[1] record, KEYS[2] its failure counter; ARGV token, fingerprint, lease ms, tool.
        reserve: script(
            r#"
local r = load(KEYS[1])
if r == false then return {'corrupt', 'the key holds something other than a hash'} end
local now = now_ms()
if r then
  if not expired(r, now) then return reply(now, r) end
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
        // KEYS[1] record; ARGV token, outcome, retain ms, TTL margin ms.
        complete: script(
            r#"
local r = load(KEYS[1])
if not held(r, ARGV[1]) then return 0 end
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
redis.call('HSET', KEYS[1], 'lease_until', ms(now_ms() + tonumber(ARGV[2])))
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
  redis.call('DEL', KEYS[1])
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
static COUNT_FAILURE: LazyLock<Script> = LazyLock::new(|| {
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

/// `text` with the characters `SCAN MATCH` treats as a pattern escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl Store for RedisStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (fp, lease) = (fingerprint.to_hex(), span_ms(lease).to_string());
        let mut invocation = SCRIPTS.reserve.key(self.redis_key(key));
        invocation.key(self.failures_key(key));
        match self
            .read_from(invocation, key, &[token.as_str(), &fp, &lease, tool])
            .await?
        {
            Read::Reserved(failures) => Ok(Reservation::Reserved {
                token: token.clone(),
                failures,
            }),
            Read::Found(stored, now) => stored.to_record(key, now).map(Reservation::Existing),
            Read::Absent => Err(StoreError::Unavailable(
                "redis: reserve answered absent".into(),
            )),
        }
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let (text, retain) = (outcome.to_stored(), span_ms(retain).to_string());
        let margin = span_ms(TTL_MARGIN).to_string();
        self.fenced(
            &SCRIPTS.complete,
            key,
            &[token.as_str(), &text, &retain, &margin],
        )
        .await
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.fenced(&SCRIPTS.release, key, &[token.as_str()]).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.fenced(
            &SCRIPTS.renew,
            key,
            &[token.as_str(), &span_ms(lease).to_string()],
        )
        .await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.fenced(&SCRIPTS.mark_unknown, key, &[token.as_str()])
            .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let token = Token::generate();
        let lease = span_ms(lease).to_string();
        let won = self
            .fenced(
                &SCRIPTS.take_over,
                key,
                &[stale.as_str(), token.as_str(), &lease],
            )
            .await?;
        Ok(won.then_some(token))
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.read(&SCRIPTS.get, key, &[]).await? {
            Read::Found(stored, now) if !stored.expired(now) => {
                stored.to_record(key, now).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Completed records leave Redis by their TTL soon after they expire; this deletes those
    /// still there, walking the prefix's keys with `SCAN` until it deleted `limit` or saw every
    /// key. Each call starts a new walk, so it costs time in proportion to the number of
    /// records: run it rarely, if at all.
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let pattern = self.pattern(None);
        let mut cursor = 0u64;
        let mut purged = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            // Never more than `limit`: each script is given at most the keys still allowed.
            let mut rest = keys.as_slice();
            while !rest.is_empty() && (purged as usize) < limit {
                let (batch, after) = rest.split_at(rest.len().min(limit - purged as usize));
                rest = after;
                let mut invocation = SCRIPTS.purge.prepare_invoke();
                for key in batch {
                    invocation.key(key.as_slice());
                }
                let n: u64 = invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                purged += n;
            }
            if next == 0 || purged as usize >= limit {
                return Ok(purged);
            }
            cursor = next;
        }
    }

    /// Walks the prefix's keys (one tenant's, when the filter names it) with `SCAN`, and reads
    /// a page's records with the server's clock in one script.
    ///
    /// `SCAN` walks the whole keyspace, other prefixes' keys included, and its `COUNT` bounds
    /// the slots one step visits, not the keys it returns: on a server shared with a million
    /// other keys, steps of `limit` slots would mostly come back empty. So a page takes steps
    /// until it holds `limit` keys, the walk ends, or it took 64 steps (the
    /// page may then be empty, with a cursor to go on from); each step that fell short visits
    /// four times as many slots as the one before, up to 500 slots (or `limit`, if more).
    /// A page may hold a little more than `limit` records. A key the server moves while it
    /// rehashes may appear on two pages, as `SCAN` documents; within a page it appears once.
    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let mut conn = self.conn.clone();
        let keys: Vec<Vec<u8>>;
        let mut page = Page::default();
        if let (Some(tenant), Some(key)) = (&filter.tenant, &filter.key) {
            if cursor.is_some() {
                return Ok(page);
            }
            keys = vec![self.redis_key(&RecordKey::new(tenant, key)).into_bytes()];
        } else {
            let from: u64 = match cursor {
                Some(c) => c.as_str().parse().map_err(|_| {
                    StoreError::Config(format!("not a cursor of this store: {:?}", c.as_str()))
                })?,
                None => 0,
            };
            let pattern = self.pattern(filter.tenant.as_deref());
            let mut at = from;
            let limit = limit.max(1);
            let widest = limit.max(SCAN_COUNT);
            let mut count = limit;
            let mut found: Vec<Vec<u8>> = Vec::new();
            for _ in 0..SCAN_STEPS_PER_PAGE {
                let (next, step): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(at)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                found.extend(step);
                at = next;
                if at == 0 || found.len() >= limit {
                    break;
                }
                count = count.saturating_mul(4).min(widest);
            }
            found.sort_unstable();
            found.dedup();
            page.next = (at != 0).then(|| Cursor::new(at.to_string()));
            keys = found;
        }
        if keys.is_empty() {
            return Ok(page);
        }
        let mut invocation = SCRIPTS.list.prepare_invoke();
        for key in &keys {
            invocation.key(key.as_slice());
        }
        let replies: Vec<Vec<Option<Vec<u8>>>> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        for (redis_key, reply) in keys.iter().zip(replies) {
            let Some(key) = self.record_key(redis_key) else {
                continue;
            };
            if reply
                .first()
                .is_some_and(|tag| tag.as_deref() == Some(b"skip"))
            {
                continue;
            }
            if let Read::Found(stored, now) = parse_read(&key, reply)? {
                if let Some(entry) = stored.to_entry(&key, now)? {
                    if filter.admits(&entry, from_millis(now)) {
                        page.entries.push(entry);
                    }
                }
            }
        }
        page.entries
            .sort_by(|a, b| (&a.key.tenant, &a.key.key).cmp(&(&b.key.tenant, &b.key.key)));
        Ok(page)
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let margin = span_ms(TTL_MARGIN).to_string();
        match resolution {
            Resolution::Done { outcome, retain } => {
                let (text, retain) = (outcome.to_stored(), span_ms(*retain).to_string());
                self.fenced(
                    &SCRIPTS.resolve,
                    key,
                    &[seen.as_str(), "done", &text, &retain, &margin],
                )
                .await
            }
            Resolution::NotDone => {
                self.fenced(
                    &SCRIPTS.resolve,
                    key,
                    &[seen.as_str(), "not_done", "", "0", &margin],
                )
                .await
            }
        }
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(from_millis(secs * 1000 + micros / 1000))
    }

    // Retry limits: one counter key per record key, with a TTL of its window.
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        let failures: i64 = COUNT_FAILURE
            .key(self.failures_key(key))
            .arg(span_ms(window).max(1))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(failures.max(0) as u64)
    }

    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        let failures: Option<i64> = redis::cmd("GET")
            .arg(self.failures_key(key))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(failures.unwrap_or(0).max(0) as u64)
    }

    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        redis::cmd("DEL")
            .arg(self.failures_key(key))
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .map(drop)
            .map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_policies_are_judged() {
        assert_eq!(eviction_risk("noeviction"), None);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-ttl",
        ] {
            assert!(eviction_risk(policy).is_some(), "{policy}");
        }
        assert!(eviction_risk("volatile-lfu").unwrap().contains("completed"));
    }

    #[test]
    fn failure_counters_cannot_be_spelled_by_a_record_key() {
        let key = |tenant: &str, k: &str| {
            let key = RecordKey::new(tenant, k);
            (
                escaped("toolkey", "", &key),
                escaped("toolkey", FAILURES, &key),
            )
        };
        let (record, counter) = key("acme", "invoice:acme:2026-10");
        assert_eq!(record, r"toolkey:acme:invoice\:acme\:2026-10");
        assert_eq!(counter, r"toolkey\failures:acme:invoice\:acme\:2026-10");
        // A tenant that tries to spell the counter's marker is escaped.
        let (forged, _) = key(r"\failures:acme", "invoice:acme:2026-10");
        assert_ne!(forged, counter);
        assert_eq!(forged, r"toolkey:\\failures\:acme:invoice\:acme\:2026-10");
        assert!(
            !counter.starts_with("toolkey:"),
            "SCAN <prefix>:* skips counters"
        );
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
    }

    #[test]
    fn replies_are_read_or_corrupt() {
        let key = RecordKey::new("t", "k");
        let text = |s: &str| Some(s.as_bytes().to_vec());
        assert!(matches!(
            parse_read(&key, vec![text("absent")]),
            Ok(Read::Absent)
        ));
        assert!(matches!(
            parse_read(&key, vec![text("corrupt"), text("why")]),
            Err(StoreError::Corrupt { .. })
        ));
        let record = |since: &str| {
            vec![
                text("record"),
                text("100"),
                text("in_progress"),
                text("tok"),
                text("fp"),
                text(since),
                text("200"),
                None,
                None,
                None,
            ]
        };
        assert!(matches!(
            parse_read(&key, record("50")),
            Ok(Read::Found(_, 100))
        ));
        assert!(matches!(
            parse_read(&key, record("fifty")),
            Err(StoreError::Corrupt { .. })
        ));
        let mut bad_utf8 = record("50");
        bad_utf8[3] = Some(vec![0xff]);
        assert!(matches!(
            parse_read(&key, bad_utf8),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
