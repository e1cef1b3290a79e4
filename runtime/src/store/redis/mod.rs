//! The Redis store: one hash per record, every transition one Lua script on the server's clock.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{
    Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, Script, ServerErrorKind, Value,
};

use super::row::{span_ms, StoredRecord};
use super::{
    from_millis, Cursor, FailureCounters, Filter, OperatorCommands, Outcome, Page, Record,
    RecordKey, Reservation, Reservations, Resolution, StoreError, Token,
};
use crate::Fingerprint;

mod approvals;
mod builder;
mod counters;
mod keys;
mod operator;
mod reservations;
mod scripts;
#[cfg(test)]
mod tests;

use keys::{
    escaped, glob_escape, not_a_cursor, parse_shards, tenant_prefix, unescaped, Position, FAILURES,
};
use scripts::{COUNT_FAILURE, SCRIPTS};

/// How long a completed record stays in Redis after its retention: the TTL only frees memory,
/// expiry itself is checked against `expires_at` at read time. The margin lets
/// [`OperatorCommands::purge_expired`] find what expired recently, and keeps a record whose TTL
/// the server judges a little early from vanishing before it is expired by `expires_at`.
const TTL_MARGIN: Duration = Duration::from_secs(60);

/// How many slots one `SCAN` step of [`OperatorCommands::purge_expired`] visits, and the most
/// one step of [`OperatorCommands::list`] widens to.
const SCAN_COUNT: usize = 500;

/// The most `SCAN` steps one page of [`OperatorCommands::list`] takes looking for records.
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
/// # Redis Cluster
///
/// [`RedisStore::cluster_builder`] connects to a cluster through redis-rs's cluster client. Its
/// keys carry a hash tag, `<prefix>:{<tenant>:<key>}` and `<prefix>\failures:{<tenant>:<key>}`,
/// with `{` and `}` inside the tenant and key also escaped (as `\(` and `\)`), so a record and
/// its failure counter always hash to one slot and every transition is one script on one node.
/// (A prefix may not contain `{` or `}`. The layout differs from a single server's, so records do
/// not move between the two.) Listing and purging walk every shard's primary with `SCAN` in turn
/// and read each key with its own script; the store's clock is any node's `TIME`, so keep the
/// nodes' clocks in sync.
///
/// # What an acknowledged reservation survives
///
/// Redis replicates asynchronously: a primary answers a script before its replicas have the
/// write. A reservation answered `Reserved` (or a completion answered `true`) survives a crash of
/// the process that asked; it survives the loss of the primary only if a replica had it when the
/// replica was promoted. Measured on a local cluster (cluster-node-timeout 1 s, 32 tasks
/// reserving distinct keys): a primary frozen until its replica was promoted, then thawed,
/// answered the 32 requests its clients had queued on it, as the primary it still believed it
/// was, and those 32 reservations were gone once it rejoined as a replica; a primary killed
/// outright lost none in that run (on loopback its replica kept up with it). Either way a
/// lost reservation lets a retry run the work a second time.
///
/// [`RedisStoreBuilder::wait_for_replicas`] closes that window for writes that are answered:
/// each transition is followed by `WAIT` in the same round trip, and one that too few replicas
/// acknowledged in time fails closed as [`StoreError::Unavailable`] (the call does not run its
/// body). In the same frozen-primary test no acknowledged reservation was lost: the thawed
/// primary's replica had gone, so its writes were refused. This is not strong consistency: `WAIT`
/// does not make Redis a consensus system, a write refused for want of acknowledgements may still
/// be applied (and then replicated), and a failover can still promote a replica that missed an
/// acknowledged write if the acknowledging replica is not the one elected (with more than one
/// replica per primary, wait for all of them). `WAIT` also blocks the connection it is sent on;
/// the store shares one connection per node among all calls, so concurrent calls queue behind
/// each other's waits. On a loopback cluster a reserve and a complete took 1.45 times as long
/// with `WAIT 1` one at a time, and 3.3 times as long 32 at once (the `stores` bench).
///
/// # What the server must be configured for
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
/// - **Replication, with care.** A replica promoted after its primary failed may lack the last
///   writes its primary acknowledged (see above); use [`RedisStoreBuilder::wait_for_replicas`]
///   where a lost reservation costs more than the wait.
///
/// On one server the store talks over a [`ConnectionManager`]: one multiplexed connection that
/// reconnects after it breaks. The call that meets the broken connection fails with
/// [`StoreError::Unavailable`], and so does every call while the server cannot be reached; then
/// calls succeed again. On a cluster the client keeps one connection per node, and follows
/// redirects and a failover's new topology by retrying within the store's timeout; a call that no
/// node took in time is [`StoreError::Unavailable`].
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
/// let cluster = RedisStore::cluster_builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
///     .wait_for_replicas(1, std::time::Duration::from_millis(200))
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
// Gated here too: the facade shows the store module from this crate, and rustdoc reads only
// an item's own cfg across crates.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStore {
    conn: Connection,
    prefix: String,
    layout: Layout,
    replicas: Option<Replicas>,
    eviction_policy: Option<String>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("layout", &self.layout)
            .field("replicas", &self.replicas)
            .field("eviction_policy", &self.eviction_policy)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RedisStore`].
#[derive(Clone)]
// Gated here too: the facade shows the store module from this crate, and rustdoc reads only
// an item's own cfg across crates.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    nodes: Nodes,
    prefix: String,
    timeout: Duration,
    replicas: Option<Replicas>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URLs may carry a password.
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

/// What the store connects to.
#[derive(Clone)]
enum Nodes {
    Standalone(String),
    Cluster(Vec<String>),
}

/// How many replicas must acknowledge each transition (`WAIT`), and for how long the store waits.
#[derive(Clone, Copy, Debug)]
struct Replicas {
    count: usize,
    timeout: Duration,
}

/// How keys are spelled: on one server as they always were, on a cluster with a hash tag around
/// the tenant and key, so that a record and its failure counter live in one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Standalone,
    Cluster,
}

/// A standalone server's connection, or a cluster's: one multiplexed connection per node, each
/// command routed by its key's slot. The scripts and commands run on either alike.
#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
        }
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host[:port][/db]`) with the
    /// defaults: prefix `toolkey`, 5 s timeouts. The server must answer: an unreachable one is
    /// [`StoreError::Unavailable`].
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// A builder for a store connecting to the server at `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            nodes: Nodes::Standalone(url.into()),
            prefix: "toolkey".into(),
            timeout: Duration::from_secs(5),
            replicas: None,
        }
    }

    /// A builder for a store on the Redis Cluster that `nodes` belong to (each a
    /// `redis://[user:password@]host[:port]` URL; one reachable node is enough, the client learns
    /// the others from it). Keys are hash-tagged (see [`RedisStore`]); a record and its failure
    /// counter share a slot, and every operation touches one slot.
    pub fn cluster_builder<I>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStoreBuilder {
            nodes: Nodes::Cluster(nodes.into_iter().map(Into::into).collect()),
            prefix: "toolkey".into(),
            timeout: Duration::from_secs(5),
            replicas: None,
        }
    }

    /// The server's `maxmemory-policy` as read on connect, if the server let it be read.
    pub fn eviction_policy(&self) -> Option<&str> {
        self.eviction_policy.as_deref()
    }

    /// The Redis key of a record.
    fn redis_key(&self, key: &RecordKey) -> String {
        escaped(&self.prefix, "", key, self.layout)
    }

    /// The Redis key of a failure counter: `<prefix>\failures:<tenant>:<key>` (on a cluster
    /// `<prefix>\failures:{<tenant>:<key>}`, in its record's slot). No record key can spell it
    /// (a record key's first `\` escapes a character of the tenant or key, and the prefix has
    /// none), and `SCAN <prefix>:*` never meets it.
    fn failures_key(&self, key: &RecordKey) -> String {
        escaped(&self.prefix, FAILURES, key, self.layout)
    }

    /// The record key a Redis key of this store's spells, or `None` for a key that is not one
    /// of its records.
    fn record_key(&self, redis_key: &[u8]) -> Option<RecordKey> {
        unescaped(&self.prefix, self.layout, redis_key)
    }

    /// The `SCAN MATCH` pattern of this store's records (of one tenant's, if given).
    fn pattern(&self, tenant: Option<&str>) -> String {
        match tenant {
            Some(tenant) => {
                let spelled = tenant_prefix(&self.prefix, tenant, self.layout);
                format!("{}*", glob_escape(&spelled))
            }
            None => format!("{}:*", glob_escape(&self.prefix)),
        }
    }

    /// Reads a record and the server's clock in one step; `None` when there is no record.
    /// `write` says whether the script may change the record (see [`RedisStore::eval`]).
    async fn read(
        &self,
        script: &Script,
        keys: &[String],
        key: &RecordKey,
        args: &[&str],
        write: bool,
    ) -> Result<Read, StoreError> {
        let reply: Vec<Option<Vec<u8>>> = self.eval(script, keys, args, write).await?;
        parse_read(key, reply)
    }

    /// Runs a fenced script: true when it changed the record.
    async fn fenced(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&str],
    ) -> Result<bool, StoreError> {
        let changed: i64 = self
            .eval(script, &[self.redis_key(key)], args, true)
            .await?;
        Ok(changed == 1)
    }

    /// Runs `script` on `keys` (all in one slot) and `args`. When the store waits for replicas
    /// and the script may write, `WAIT` follows it in the same round trip on the same connection,
    /// and a write too few replicas acknowledged in time is [`StoreError::Unavailable`]: the
    /// caller cannot tell it from a lost reply, and treats it so.
    async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
        write: bool,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let Some(replicas) = self.replicas.filter(|_| write) else {
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key.as_str());
            }
            for arg in args {
                invocation.arg(*arg);
            }
            return invocation
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable);
        };
        let mut eval = redis::cmd("EVALSHA");
        eval.arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(replicas.count)
            .arg(span_ms(replicas.timeout).max(1))
            .ignore_errors();
        for attempt in 0..2 {
            let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
            let Ok([reply, acknowledged]) = <[Value; 2]>::try_from(replies) else {
                return Err(StoreError::Unavailable(
                    "redis: a script and its WAIT did not answer twice".into(),
                ));
            };
            let reply = match reply {
                Value::ServerError(e) if attempt == 0 => {
                    match e.kind() {
                        // A server that lost its scripts (a restart, a replica just promoted).
                        Some(ServerErrorKind::NoScript) => {
                            script.load_async(&mut conn).await.map_err(unavailable)?;
                        }
                        // The slot is served elsewhere now. A pipeline's redirect does not move
                        // the cluster client's slot map; a single command's does, and is harmless.
                        Some(
                            ServerErrorKind::Moved
                            | ServerErrorKind::Ask
                            | ServerErrorKind::TryAgain
                            | ServerErrorKind::ClusterDown
                            | ServerErrorKind::MasterDown
                            | ServerErrorKind::ReadOnly,
                        ) if !keys.is_empty() => {
                            let _: Result<i64, _> = redis::cmd("EXISTS")
                                .arg(&keys[0])
                                .query_async(&mut conn)
                                .await;
                        }
                        _ => return Err(unavailable(e.into())),
                    }
                    continue;
                }
                Value::ServerError(e) => return Err(unavailable(e.into())),
                reply => reply,
            };
            let acknowledged = match acknowledged {
                Value::Int(n) => n,
                other => {
                    return Err(StoreError::Unavailable(format!(
                        "redis: WAIT answered {other:?}"
                    )))
                }
            };
            if acknowledged < replicas.count as i64 {
                return Err(StoreError::Unavailable(format!(
                    "redis: {acknowledged} of {} replicas acknowledged the write within {:?}; it \
                     may be lost if its primary fails",
                    replicas.count, replicas.timeout
                )));
            }
            return redis::from_redis_value(reply)
                .map_err(|e| StoreError::Unavailable(format!("redis: {e}")));
        }
        Err(StoreError::Unavailable(
            "redis: the script could not be run after loading it or following its slot".into(),
        ))
    }

    /// The cluster's shards, each named by the lowest slot its primary serves, in order. A
    /// shard's name routes to whichever node is its primary now, so a walk over the shards
    /// survives a failover.
    async fn shards(&self) -> Result<Vec<u16>, StoreError> {
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        parse_shards(reply)
    }

    /// One `SCAN` step from `at`: the keys it found, and where the walk goes on (`None` when it
    /// has seen every key). On a cluster, a shard's walk that ends goes on at the next shard.
    async fn scan(
        &self,
        at: Position,
        shards: &[u16],
        pattern: &str,
        count: usize,
    ) -> Result<(Option<Position>, Vec<Vec<u8>>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(at.cursor())
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        match (&self.conn, at) {
            (Connection::Cluster(conn), Position::Shard { slot, .. }) => {
                let slot_of_shard = Slot::new(slot).ok_or_else(|| not_a_cursor(&at.to_string()))?;
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::with_slot(slot_of_shard, SlotAddr::Master),
                ));
                let reply = conn
                    .clone()
                    .route_command(scan, route)
                    .await
                    .map_err(unavailable)?;
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                    .map_err(|e| StoreError::Unavailable(format!("redis: SCAN: {e}")))?;
                let next = match next {
                    0 => shards
                        .iter()
                        .find(|&&s| s > slot)
                        .map(|&slot| Position::Shard { slot, cursor: 0 }),
                    cursor => Some(Position::Shard { slot, cursor }),
                };
                Ok((next, keys))
            }
            (Connection::Standalone(conn), Position::Server(_)) => {
                let (next, keys): (u64, Vec<Vec<u8>>) = scan
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(unavailable)?;
                Ok(((next != 0).then_some(Position::Server(next)), keys))
            }
            _ => Err(not_a_cursor(&at.to_string())),
        }
    }

    /// Where a walk over every key starts (`None` on a cluster that serves no slot), and the
    /// cluster's shards.
    async fn start(&self) -> Result<(Option<Position>, Vec<u16>), StoreError> {
        match self.layout {
            Layout::Standalone => Ok((Some(Position::Server(0)), Vec::new())),
            Layout::Cluster => {
                let shards = self.shards().await?;
                let start = shards
                    .first()
                    .map(|&slot| Position::Shard { slot, cursor: 0 });
                Ok((start, shards))
            }
        }
    }

    /// Reads the records at `keys`, which `SCAN` found, each as the `list` script answers: on
    /// one server in one invocation; on a cluster, where they lie in many slots, one invocation
    /// per key, all sent at once on the nodes' connections.
    async fn read_listed(&self, keys: &[Vec<u8>]) -> Result<Vec<Vec<Option<Vec<u8>>>>, StoreError> {
        self.per_key(
            &SCRIPTS.list,
            keys,
            |replies: Vec<Vec<Vec<Option<Vec<u8>>>>>| replies.into_iter().flatten().collect(),
        )
        .await
    }

    /// Deletes the expired records among `keys`, which `SCAN` found, as [`RedisStore::read_listed`]
    /// reads them; how many it deleted.
    async fn purge(&self, keys: &[Vec<u8>]) -> Result<u64, StoreError> {
        self.per_key(&SCRIPTS.purge, keys, |counts: Vec<u64>| counts.iter().sum())
            .await
    }

    /// Runs a script over many keys: on one server once with all of them; on a cluster once per
    /// key, concurrently; `gather` makes one answer of the invocations' replies.
    async fn per_key<T: FromRedisValue, R>(
        &self,
        script: &Script,
        keys: &[Vec<u8>],
        gather: impl FnOnce(Vec<T>) -> R,
    ) -> Result<R, StoreError> {
        let batches: Vec<&[Vec<u8>]> = match self.layout {
            Layout::Standalone => vec![keys],
            Layout::Cluster => keys.chunks(1).collect(),
        };
        let calls = batches.into_iter().map(|batch| {
            let mut conn = self.conn.clone();
            async move {
                let mut invocation = script.prepare_invoke();
                for key in batch {
                    invocation.key(key.as_slice());
                }
                invocation.invoke_async::<T>(&mut conn).await
            }
        });
        let replies = futures_util::future::try_join_all(calls)
            .await
            .map_err(unavailable)?;
        Ok(gather(replies))
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
