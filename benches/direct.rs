//! The same server work as the stores do, written directly with the client crates: the statements
//! and scripts the benches compare the stores with. They mirror those in
//! `runtime/src/store/{postgres,redis}.rs`.

pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const LEASE_MS: i64 = 30_000;
/// Short, so the bench's Redis records leave soon.
pub const RETAIN_MS: i64 = 1_000;

pub const NOW: &str = "date_trunc('milliseconds', now())";

pub fn pg_reserve() -> String {
    let ms = |c: &str| format!("(extract(epoch FROM {c}) * 1000)::int8");
    format!(
        "WITH reserved AS (
             INSERT INTO toolkey_records AS r (tenant, key, state, token, fingerprint, since, lease_until)
             VALUES ($1, $2, 'in_progress', $3, $4, {NOW}, {NOW} + $5::int8 * interval '1 millisecond')
             ON CONFLICT (tenant, key) DO UPDATE SET
                 state = EXCLUDED.state, token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
                 since = EXCLUDED.since, lease_until = EXCLUDED.lease_until, outcome = NULL,
                 completed_at = NULL, expires_at = NULL
             WHERE r.state = 'completed' AND r.expires_at <= {NOW}
             RETURNING 1
         )
         SELECT true, NULL::text, NULL::text, NULL::text, NULL::int8, NULL::int8,
                NULL::text, NULL::int8, NULL::int8, NULL::int8
         FROM reserved
         UNION ALL
         SELECT false, state, token, fingerprint, {}, {}, outcome, {}, {}, {}
         FROM toolkey_records WHERE tenant = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM reserved)",
        ms("since"),
        ms("lease_until"),
        ms("completed_at"),
        ms("expires_at"),
        ms(NOW)
    )
}

pub fn pg_complete() -> String {
    format!(
        "UPDATE toolkey_records SET state = 'completed', outcome = $4, completed_at = {NOW},
             expires_at = {NOW} + $5::int8 * interval '1 millisecond'
         WHERE tenant = $1 AND key = $2 AND token = $3 AND state = 'in_progress'"
    )
}

pub fn pg_get() -> String {
    let ms = |c: &str| format!("(extract(epoch FROM {c}) * 1000)::int8");
    format!(
        "SELECT state, token, fingerprint, {}, {}, outcome, {}, {}, {}
         FROM toolkey_records WHERE tenant = $1 AND key = $2",
        ms("since"),
        ms("lease_until"),
        ms("completed_at"),
        ms("expires_at"),
        ms(NOW)
    )
}

pub const LUA_PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(n) return string.format('%d', n) end
local function load(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return nil end
  if kind ~= 'hash' then return false end
  return redis.call('HMGET', key, 'state', 'token', 'fp', 'since', 'lease_until', 'outcome', 'completed_at', 'expires_at')
end
local function reply(now, r)
  return {'record', ms(now), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]}
end
"#;

pub const LUA_RESERVE: &str = r#"
local r = load(KEYS[1])
if r == false then return {'corrupt', 'not a hash'} end
local now = now_ms()
if r then
  local at = tonumber(r[8])
  if not (r[1] == 'completed' and at ~= nil and at <= now) then return reply(now, r) end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'token', ARGV[1], 'fp', ARGV[2],
  'since', ms(now), 'lease_until', ms(now + tonumber(ARGV[3])))
return {'reserved'}
"#;

pub const LUA_COMPLETE: &str = r#"
local r = load(KEYS[1])
if not (r and r[1] == 'in_progress' and r[2] == ARGV[1]) then return 0 end
local now = now_ms()
local retain = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'completed', 'outcome', ARGV[2],
  'completed_at', ms(now), 'expires_at', ms(now + retain))
redis.call('PEXPIRE', KEYS[1], ms(retain + tonumber(ARGV[4])))
return 1
"#;

pub const LUA_GET: &str = r#"
local r = load(KEYS[1])
if r == false then return {'corrupt', 'not a hash'} end
if r == nil then return {'absent'} end
return reply(now_ms(), r)
"#;

/// The store's side of a first run: reserve `key` (free) and complete it, kept `RETAIN_MS`.
pub async fn store_first_run(
    store: &dyn toolkey::store::Store,
    key: &toolkey::store::RecordKey,
    fp: &toolkey::Fingerprint,
    outcome: &toolkey::store::Outcome,
) {
    let retain = std::time::Duration::from_millis(RETAIN_MS as u64);
    store_first_run_kept(store, key, fp, outcome, retain).await
}

/// [`store_first_run`], the outcome kept for `retain`.
pub async fn store_first_run_kept(
    store: &dyn toolkey::store::Store,
    key: &toolkey::store::RecordKey,
    fp: &toolkey::Fingerprint,
    outcome: &toolkey::store::Outcome,
    retain: std::time::Duration,
) {
    let lease = std::time::Duration::from_millis(LEASE_MS as u64);
    let toolkey::store::Reservation::Reserved { token, .. } = store
        .reserve(key, "tool", fp, &toolkey::store::Token::generate(), lease)
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    assert!(store.complete(key, &token, outcome, retain).await.unwrap());
}

/// The raw clients the stores are set beside, with a first run's statements and scripts: a
/// deadpool pool of 16 for PostgreSQL, a `ConnectionManager` for Redis.
pub struct Direct {
    pub pool: deadpool_postgres::Pool,
    pub redis: redis::aio::ConnectionManager,
    /// `pg_reserve` and `pg_complete`.
    pg: (String, String),
    /// `LUA_RESERVE` and `LUA_COMPLETE`, each after `LUA_PRELUDE`.
    pub lua: (redis::Script, redis::Script),
}

impl Direct {
    /// A first run's statements run directly: the reserve and the complete of `key`, each on a
    /// client of the pool.
    pub async fn pg_first_run(&self, tenant: &str, key: &str, fp_hex: &str, outcome_text: &str) {
        let token = toolkey::store::Token::generate();
        let client = self.pool.get().await.unwrap();
        let st = client.prepare_cached(&self.pg.0).await.unwrap();
        let row = client
            .query_opt(&st, &[&tenant, &key, &token.as_str(), &fp_hex, &LEASE_MS])
            .await
            .unwrap();
        assert!(row.is_some());
        drop(client);
        let client = self.pool.get().await.unwrap();
        let st = client.prepare_cached(&self.pg.1).await.unwrap();
        let changed = client
            .execute(
                &st,
                &[&tenant, &key, &token.as_str(), &outcome_text, &RETAIN_MS],
            )
            .await
            .unwrap();
        assert_eq!(changed, 1);
    }

    /// A first run's scripts run directly on `key` (a Redis key), the outcome kept `retain_ms`.
    pub async fn redis_first_run(
        &self,
        key: &str,
        fp_hex: &str,
        outcome_text: &str,
        retain_ms: i64,
    ) {
        let mut conn = self.redis.clone();
        let token = toolkey::store::Token::generate();
        let reply: Vec<Option<Vec<u8>>> = self
            .lua
            .0
            .key(key)
            .arg(token.as_str())
            .arg(fp_hex)
            .arg(LEASE_MS)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(reply[0].as_deref(), Some(&b"reserved"[..]));
        let changed: i64 = self
            .lua
            .1
            .key(key)
            .arg(token.as_str())
            .arg(outcome_text)
            .arg(retain_ms)
            .arg(60_000)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(changed, 1);
    }
}

/// The PostgreSQL store, the Redis store, and the raw clients beside them.
pub async fn connect() -> (
    toolkey::store::PostgresStore,
    toolkey::store::RedisStore,
    Direct,
) {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
    let pg = toolkey::store::PostgresStore::connect(PG_URL)
        .await
        .expect("PostgreSQL for the bench (bash .ci/services.sh)");
    let manager = Manager::from_config(
        PG_URL.parse().unwrap(),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(16)
        .runtime(Runtime::Tokio1)
        .build()
        .unwrap();
    let redis_store = toolkey::store::RedisStore::connect(REDIS_URL)
        .await
        .expect("Redis for the bench (bash .ci/services.sh)");
    let client = redis::Client::open(REDIS_URL).unwrap();
    let redis = redis::aio::ConnectionManager::new(client).await.unwrap();
    let script = |body: &str| redis::Script::new(&format!("{LUA_PRELUDE}{body}"));
    let direct = Direct {
        pool,
        redis,
        pg: (pg_reserve(), pg_complete()),
        lua: (script(LUA_RESERVE), script(LUA_COMPLETE)),
    };
    (pg, redis_store, direct)
}
