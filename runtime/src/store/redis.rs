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

    /// Makes every transition (reserve, complete, release, renew, take-over, resolve, marking
    /// an outcome unknown) wait until `count` replicas acknowledged it (`WAIT`, in the same round
    /// trip), for at most `timeout`, which must be shorter than [`RedisStoreBuilder::timeout`].
    /// A transition that fewer replicas acknowledged in time is [`StoreError::Unavailable`]: it
    /// was applied on the primary, but is not trusted to survive the primary's failure, so the
    /// call fails closed. See [`RedisStore`] on what this does and does not guarantee. Off by
    /// default.
    pub fn wait_for_replicas(mut self, count: usize, timeout: Duration) -> Self {
        self.replicas = Some(Replicas { count, timeout });
        self
    }

    /// Connects, and reads the servers' `maxmemory-policy` (see [`RedisStore`] on eviction).
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let layout = match self.nodes {
            Nodes::Standalone(_) => Layout::Standalone,
            Nodes::Cluster(_) => Layout::Cluster,
        };
        if self.prefix.is_empty() || self.prefix.contains('\\') {
            return Err(StoreError::Config(format!(
                "redis: invalid key prefix {:?}: it must be non-empty and without `\\`",
                self.prefix
            )));
        }
        if layout == Layout::Cluster && self.prefix.contains(['{', '}']) {
            return Err(StoreError::Config(format!(
                "redis: invalid key prefix {:?}: on a cluster it must not contain `{{` or `}}`, \
                 which would move the keys' hash tag",
                self.prefix
            )));
        }
        if let Some(replicas) = self.replicas {
            if replicas.count == 0 || replicas.timeout.is_zero() || replicas.timeout >= self.timeout
            {
                return Err(StoreError::Config(format!(
                    "redis: wait_for_replicas({}, {:?}) needs at least one replica and a timeout \
                     above zero and shorter than the store's timeout ({:?})",
                    replicas.count, replicas.timeout, self.timeout
                )));
            }
        }
        let mut conn = match &self.nodes {
            Nodes::Standalone(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| StoreError::Config(format!("redis: bad connection URL: {e}")))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    // Reconnecting retries a little, then fails the waiting calls: a store that
                    // cannot reach its server must answer Unavailable soon, not queue calls.
                    .set_number_of_retries(2);
                Connection::Standalone(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(unavailable)?,
                )
            }
            Nodes::Cluster(nodes) => {
                if nodes.is_empty() {
                    return Err(StoreError::Config(
                        "redis: a cluster store needs at least one node's URL".into(),
                    ));
                }
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    // The client follows redirects and a failover's new topology by retrying;
                    // however it retries, a call answers within the timeout, Unavailable if
                    // no node took it.
                    .overall_response_timeout(Some(self.timeout))
                    .build()
                    .map_err(|e| StoreError::Config(format!("redis: bad node URL: {e}")))?;
                let connecting = client.get_async_connection();
                match tokio::time::timeout(self.timeout, connecting).await {
                    Ok(conn) => Connection::Cluster(conn.map_err(unavailable)?),
                    Err(_) => {
                        return Err(StoreError::Unavailable(format!(
                            "redis: no cluster node answered within {:?}",
                            self.timeout
                        )))
                    }
                }
            }
        };
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
            layout,
            replicas: self.replicas,
            eviction_policy,
        })
    }
}

/// Records the schema version under the prefix, or refuses records written by a newer toolkey.
async fn check_version(conn: &mut Connection, prefix: &str) -> Result<(), StoreError> {
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

/// The server's `maxmemory-policy` (on a cluster, the riskiest of every node's: any node may
/// become a primary), or `None` when a server refuses `CONFIG GET` (managed services often do).
/// A connection failure is an error.
async fn read_eviction_policy(conn: &mut Connection) -> Result<Option<String>, StoreError> {
    let mut config_get = redis::cmd("CONFIG");
    config_get.arg("GET").arg("maxmemory-policy");
    let reply: Result<Vec<Value>, RedisError> = match conn {
        Connection::Standalone(conn) => config_get.query_async(conn).await.map(|v| vec![v]),
        Connection::Cluster(conn) => conn
            .route_command(
                config_get,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None)),
            )
            .await
            .map(|nodes| match nodes {
                Value::Map(nodes) => nodes.into_iter().map(|(_, reply)| reply).collect(),
                one => vec![one],
            }),
    };
    let replies = match reply {
        Ok(replies) => replies,
        Err(e)
            if e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal() =>
        {
            return Err(unavailable(e))
        }
        Err(_) => return Ok(None),
    };
    let mut policies = Vec::new();
    for reply in replies {
        match redis::from_redis_value::<HashMap<String, String>>(reply) {
            Ok(mut config) => match config.remove("maxmemory-policy") {
                Some(policy) => policies.push(policy),
                None => return Ok(None),
            },
            Err(_) => return Ok(None),
        }
    }
    let riskiest = policies
        .iter()
        .position(|p| eviction_risk(p).is_some())
        .unwrap_or(0);
    Ok(policies.into_iter().nth(riskiest))
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

/// `<prefix><kind>:<tenant>:<key>`, with `\` and `:` inside the tenant and key escaped; on a
/// cluster `<prefix><kind>:{<tenant>:<key>}`, with `{` and `}` also escaped (as `\(` and `\)`),
/// so the hash tag is exactly the tenant and key: never cut short by a `}` in them, never empty
/// (it holds at least the `:`), the same for a record and its counter.
fn escaped(prefix: &str, kind: &str, key: &RecordKey, layout: Layout) -> String {
    let mut out =
        String::with_capacity(prefix.len() + kind.len() + key.tenant.len() + key.key.len() + 4);
    out.push_str(prefix);
    out.push_str(kind);
    out.push(':');
    if layout == Layout::Cluster {
        out.push('{');
    }
    push_escaped(&mut out, &key.tenant, layout);
    out.push(':');
    push_escaped(&mut out, &key.key, layout);
    if layout == Layout::Cluster {
        out.push('}');
    }
    out
}

/// The record key `redis_key` spells under `prefix`, as [`escaped`] writes it, or `None` for a
/// key that is not a record of that prefix.
fn unescaped(prefix: &str, layout: Layout, redis_key: &[u8]) -> Option<RecordKey> {
    let text = std::str::from_utf8(redis_key).ok()?;
    let mut rest = text.strip_prefix(prefix)?.strip_prefix(':')?;
    if layout == Layout::Cluster {
        rest = rest.strip_prefix('{')?.strip_suffix('}')?;
    }
    let (mut parts, mut part, mut escaped) = (Vec::new(), String::new(), false);
    for c in rest.chars() {
        match c {
            _ if escaped => {
                part.push(layout.unescape(c)?);
                escaped = false;
            }
            '\\' => escaped = true,
            ':' => parts.push(std::mem::take(&mut part)),
            '{' | '}' if layout == Layout::Cluster => return None,
            _ => part.push(c),
        }
    }
    parts.push(part);
    match <[String; 2]>::try_from(parts) {
        Ok([tenant, key]) if !escaped => Some(RecordKey::new(tenant, key)),
        _ => None,
    }
}

/// What every record key of `tenant` starts with: `<prefix>:<tenant>:` (on a cluster
/// `<prefix>:{<tenant>:`).
fn tenant_prefix(prefix: &str, tenant: &str, layout: Layout) -> String {
    let mut out = format!("{prefix}:");
    if layout == Layout::Cluster {
        out.push('{');
    }
    push_escaped(&mut out, tenant, layout);
    out.push(':');
    out
}

fn push_escaped(out: &mut String, part: &str, layout: Layout) {
    for c in part.chars() {
        match (c, layout) {
            ('\\' | ':', _) => {
                out.push('\\');
                out.push(c);
            }
            ('{', Layout::Cluster) => out.push_str("\\("),
            ('}', Layout::Cluster) => out.push_str("\\)"),
            _ => out.push(c),
        }
    }
}

impl Layout {
    /// The character an escape `\<c>` stands for. On a cluster, only what [`push_escaped`]
    /// writes: any other escape is not a key of the store's.
    fn unescape(self, c: char) -> Option<char> {
        match (self, c) {
            (Layout::Standalone, _) => Some(c),
            (Layout::Cluster, '\\' | ':') => Some(c),
            (Layout::Cluster, '(') => Some('{'),
            (Layout::Cluster, ')') => Some('}'),
            (Layout::Cluster, _) => None,
        }
    }
}

/// Where a walk over the store's keys stands: a server's `SCAN` cursor, or on a cluster a
/// shard's (named by its lowest slot) and the `SCAN` cursor on its primary. Spelled `<cursor>`
/// and `<slot>:<cursor>` in a listing's [`Cursor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Server(u64),
    Shard { slot: u16, cursor: u64 },
}

impl Position {
    fn cursor(self) -> u64 {
        match self {
            Position::Server(cursor) | Position::Shard { cursor, .. } => cursor,
        }
    }

    fn parse(text: &str, layout: Layout) -> Option<Position> {
        match layout {
            Layout::Standalone => text.parse().ok().map(Position::Server),
            Layout::Cluster => {
                let (slot, cursor) = text.split_once(':')?;
                let slot: u16 = slot.parse().ok()?;
                Slot::new(slot)?;
                Some(Position::Shard {
                    slot,
                    cursor: cursor.parse().ok()?,
                })
            }
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Server(cursor) => write!(f, "{cursor}"),
            Position::Shard { slot, cursor } => write!(f, "{slot}:{cursor}"),
        }
    }
}

fn not_a_cursor(text: &str) -> StoreError {
    StoreError::Config(format!("not a cursor of this store: {text:?}"))
}

/// The lowest slot of each primary in a `CLUSTER SLOTS` reply (`[[start, end, [host, port,
/// id, ..], replicas..], ..]`), in order.
fn parse_shards(reply: Value) -> Result<Vec<u16>, StoreError> {
    let bad = |why: &str| StoreError::Unavailable(format!("redis: CLUSTER SLOTS: {why}"));
    let ranges: Vec<Vec<Value>> =
        redis::from_redis_value(reply).map_err(|e| bad(&e.to_string()))?;
    let mut lowest: HashMap<(String, i64), u16> = HashMap::new();
    for range in ranges {
        let mut fields = range.into_iter();
        let (Some(start), Some(_end), Some(primary)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad("a range has no primary"));
        };
        let start: u16 = redis::from_redis_value(start).map_err(|e| bad(&e.to_string()))?;
        let primary: Vec<Value> =
            redis::from_redis_value(primary).map_err(|e| bad(&e.to_string()))?;
        let mut node = primary.into_iter();
        let (Some(host), Some(port)) = (node.next(), node.next()) else {
            return Err(bad("a primary has no address"));
        };
        let address: (String, i64) = (
            redis::from_redis_value(host).map_err(|e| bad(&e.to_string()))?,
            redis::from_redis_value(port).map_err(|e| bad(&e.to_string()))?,
        );
        let slot = lowest.entry(address).or_insert(start);
        *slot = (*slot).min(start);
    }
    let mut shards: Vec<u16> = lowest.into_values().collect();
    shards.sort_unstable();
    Ok(shards)
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
local function absent(r, now)
  return r[1] == 'not_done' or expired(r, now)
end
local function held(r, token)
  return r and (r[1] == 'in_progress' or r[1] == 'not_done') and r[2] == token
end
"#;

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
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
impl Reservations for RedisStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (fp, lease) = (fingerprint.to_hex(), span_ms(lease).to_string());
        let keys = [self.redis_key(key), self.failures_key(key)];
        match self
            .read(
                &SCRIPTS.reserve,
                &keys,
                key,
                &[token.as_str(), &fp, &lease, tool],
                true,
            )
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
        match self
            .read(&SCRIPTS.get, &[self.redis_key(key)], key, &[], false)
            .await?
        {
            Read::Found(stored, now) if !stored.absent(now) => stored.to_record(key, now).map(Some),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl OperatorCommands for RedisStore {
    /// Completed records leave Redis by their TTL soon after they expire; this deletes those
    /// still there, walking the prefix's keys with `SCAN` (on a cluster, on every shard's
    /// primary in turn) until it deleted `limit` or saw every key. Each call starts a new walk,
    /// so it costs time in proportion to the number of records: run it rarely, if at all.
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let pattern = self.pattern(None);
        let (mut at, shards) = self.start().await?;
        let mut purged = 0u64;
        while let Some(position) = at {
            if purged as usize >= limit {
                break;
            }
            let (next, keys) = self.scan(position, &shards, &pattern, SCAN_COUNT).await?;
            // Never more than `limit`: each batch is at most the keys still allowed.
            let mut rest = keys.as_slice();
            while !rest.is_empty() && (purged as usize) < limit {
                let (batch, after) = rest.split_at(rest.len().min(limit - purged as usize));
                rest = after;
                purged += self.purge(batch).await?;
            }
            at = next;
        }
        Ok(purged)
    }

    /// Walks the prefix's keys (one tenant's, when the filter names it) with `SCAN`, and reads
    /// a page's records with the server's clock: on one server in one script; on a cluster, where
    /// the walk visits every shard's primary in turn, one script per key, sent together.
    ///
    /// `SCAN` walks the whole keyspace, other prefixes' keys included, and its `COUNT` bounds
    /// the slots one step visits, not the keys it returns: on a server shared with a million
    /// other keys, steps of `limit` slots would mostly come back empty. So a page takes steps
    /// until it holds `limit` keys, the walk ends, or it took 64 steps (the
    /// page may then be empty, with a cursor to go on from); each step that fell short visits
    /// four times as many slots as the one before, up to 500 slots (or `limit`, if more).
    /// A page may hold a little more than `limit` records. A key the server moves while it
    /// rehashes may appear on two pages, as `SCAN` documents; within a page it appears once. On a
    /// cluster, a listing that spans a failover or a slot migration may also miss or repeat the
    /// records of the shards involved: a `SCAN` cursor is only good on the server that gave it.
    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let keys: Vec<Vec<u8>>;
        let mut page = Page::default();
        if let (Some(tenant), Some(key)) = (&filter.tenant, &filter.key) {
            if cursor.is_some() {
                return Ok(page);
            }
            keys = vec![self.redis_key(&RecordKey::new(tenant, key)).into_bytes()];
        } else {
            let (start, shards) = self.start().await?;
            let mut at = match cursor {
                Some(c) => Some(
                    Position::parse(c.as_str(), self.layout)
                        .ok_or_else(|| not_a_cursor(c.as_str()))?,
                ),
                None => start,
            };
            let pattern = self.pattern(filter.tenant.as_deref());
            let limit = limit.max(1);
            let widest = limit.max(SCAN_COUNT);
            let mut count = limit;
            let mut found: Vec<Vec<u8>> = Vec::new();
            for _ in 0..SCAN_STEPS_PER_PAGE {
                let Some(position) = at else { break };
                let (next, step) = self.scan(position, &shards, &pattern, count).await?;
                found.extend(step);
                at = next;
                if at.is_none() || found.len() >= limit {
                    break;
                }
                count = count.saturating_mul(4).min(widest);
            }
            found.sort_unstable();
            found.dedup();
            page.next = at.map(|at| Cursor::new(at.to_string()));
            keys = found;
        }
        if keys.is_empty() {
            return Ok(page);
        }
        let replies = self.read_listed(&keys).await?;
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
            let read = parse_read(&key, reply).and_then(|read| match read {
                Read::Found(stored, now) => {
                    let entry = stored.to_entry(&key, now)?;
                    Ok(entry.filter(|e| filter.admits(e, from_millis(now))))
                }
                _ => Ok(None),
            });
            page.take(read)?;
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
}

// One counter key per record key, with a TTL of its window.
#[async_trait]
impl FailureCounters for RedisStore {
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
                escaped("toolkey", "", &key, Layout::Standalone),
                escaped("toolkey", FAILURES, &key, Layout::Standalone),
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

    /// The hash tag Redis Cluster hashes `key` by: what lies between the first `{` and the first
    /// `}` after it, unless that is empty; otherwise the whole key.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn cluster_keys_carry_the_tenant_and_key_as_their_hash_tag() {
        let key = RecordKey::new("acme", "invoice:acme:2026-10");
        let record = escaped("toolkey", "", &key, Layout::Cluster);
        let counter = escaped("toolkey", FAILURES, &key, Layout::Cluster);
        assert_eq!(record, r"toolkey:{acme:invoice\:acme\:2026-10}");
        assert_eq!(counter, r"toolkey\failures:{acme:invoice\:acme\:2026-10}");
        assert_eq!(hash_tag(&record), r"acme:invoice\:acme\:2026-10");
        assert_eq!(
            tenant_prefix("toolkey", "ac{me}", Layout::Cluster),
            r"toolkey:{ac\(me\):"
        );
        // The standalone layout is what it always was.
        assert_eq!(
            escaped("toolkey", "", &key, Layout::Standalone),
            r"toolkey:acme:invoice\:acme\:2026-10"
        );
    }

    /// Tenants and keys made of every character that means something to the layout or to Redis's
    /// hash tags: each pair gets its own key, its record and counter share a hash tag (so a
    /// slot), the tag is never empty nor cut short, and the key reads back as the pair.
    #[test]
    fn no_tenant_or_key_can_move_or_empty_the_hash_tag() {
        let parts = [
            "", "{", "}", "{}", "}{", ":", "\\", "\\(", "\\)", "(", ")", "a}b", "{a", "a:b",
            "{{}}", "\\:",
        ];
        let mut seen = HashMap::new();
        for tenant in parts {
            for k in parts {
                let key = RecordKey::new(tenant, k);
                let record = escaped("toolkey", "", &key, Layout::Cluster);
                let counter = escaped("toolkey", FAILURES, &key, Layout::Cluster);
                let tag = hash_tag(&record);
                assert!(!tag.is_empty(), "{key:?}");
                assert_eq!(tag, hash_tag(&counter), "{key:?}");
                assert_eq!(
                    format!("toolkey:{{{tag}}}"),
                    record,
                    "the tag is all of the tenant and key: {key:?}"
                );
                assert_eq!(Slot::for_key(&record), Slot::for_key(&counter), "{key:?}");
                assert_eq!(
                    unescaped("toolkey", Layout::Cluster, record.as_bytes()),
                    Some(key.clone())
                );
                assert_eq!(
                    unescaped("toolkey", Layout::Cluster, counter.as_bytes()),
                    None
                );
                assert!(
                    !record.starts_with(r"toolkey\"),
                    "a record is never a counter"
                );
                if let Some(other) = seen.insert(record.clone(), key.clone()) {
                    panic!("{other:?} and {key:?} share {record}");
                }
            }
        }
        // Keys that are no record of the layout's.
        for foreign in [
            r"toolkey:acme:k",
            r"toolkey:{acme:k",
            r"toolkey:{acme:k}x",
            r"toolkey:{ac}me:k}",
            r"toolkey:{acme:\x}",
            r"toolkey:{acme:k:j}",
        ] {
            assert_eq!(
                unescaped("toolkey", Layout::Cluster, foreign.as_bytes()),
                None,
                "{foreign}"
            );
        }
    }

    #[test]
    fn listing_cursors_name_their_shard() {
        let at = Position::Shard {
            slot: 5461,
            cursor: 1234,
        };
        assert_eq!(at.to_string(), "5461:1234");
        assert_eq!(Position::parse("5461:1234", Layout::Cluster), Some(at));
        assert_eq!(Position::parse("16384:0", Layout::Cluster), None);
        assert_eq!(Position::parse("1234", Layout::Cluster), None);
        assert_eq!(
            Position::parse("1234", Layout::Standalone),
            Some(Position::Server(1234))
        );
        assert_eq!(Position::parse("0:1234", Layout::Standalone), None);
    }

    #[test]
    fn shards_are_named_by_their_primaries_lowest_slot() {
        let node = |port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let range = |start: i64, end: i64, primary: Value, replica: Value| {
            Value::Array(vec![Value::Int(start), Value::Int(end), primary, replica])
        };
        // A primary that serves two ranges is one shard.
        let reply = Value::Array(vec![
            range(10923, 16383, node(7002, "c"), node(7003, "f")),
            range(0, 5460, node(7000, "a"), node(7004, "d")),
            range(5461, 10000, node(7001, "b"), node(7005, "e")),
            range(10001, 10922, node(7000, "a"), node(7004, "d")),
        ]);
        assert_eq!(parse_shards(reply).unwrap(), [0, 5461, 10923]);
        assert!(parse_shards(Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
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
