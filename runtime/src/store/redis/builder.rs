//! Connecting: the builder, the schema version check, and the eviction policy's risk.

use super::*;

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
pub(super) async fn check_version(conn: &mut Connection, prefix: &str) -> Result<(), StoreError> {
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
pub(super) async fn read_eviction_policy(
    conn: &mut Connection,
) -> Result<Option<String>, StoreError> {
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
pub(super) fn eviction_risk(policy: &str) -> Option<&'static str> {
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
