//! Operator commands: purging, listing and resolving records, and the server's clock.

use super::*;

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
