//! Operator commands: purging, listing and resolving records, and the clock.

use super::*;

#[async_trait]
impl OperatorCommands for MemoryStore {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.with(|records, now| {
            let mut purged = 0;
            records.table.retain(|node| {
                let purge = purged < limit && node.expired(now);
                purged += usize::from(purge);
                !purge
            });
            Ok(purged as u64)
        })
    }

    async fn now(&self) -> Result<SystemTime, StoreError> {
        Ok(self.clock.now())
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = cursor.map(Cursor::key).transpose()?;
        self.with(|records, now| {
            let mut nodes: Vec<&Node> = records
                .table
                .iter()
                .filter(|node| {
                    after
                        .as_ref()
                        .is_none_or(|a| (node.tenant(), node.key()) > (&a.tenant, &a.key))
                        && filter.tenant.as_ref().is_none_or(|t| t == node.tenant())
                        && filter.key.as_ref().is_none_or(|k| k == node.key())
                })
                .collect();
            nodes.sort_by(|a, b| (a.tenant(), a.key()).cmp(&(b.tenant(), b.key())));
            let limit = limit.max(1);
            let next = (nodes.len() > limit).then(|| Cursor::after(&nodes[limit - 1].record_key()));
            let mut page = Page {
                next,
                ..Page::default()
            };
            for node in nodes.into_iter().take(limit) {
                if node.absent(now) {
                    continue;
                }
                let read = node.fields().to_entry(&node.record_key(), now);
                page.take(read.map(|e| Some(e).filter(|e| filter.admits(e, from_millis(now)))))?;
            }
            Ok(page)
        })
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let done = match resolution {
            Resolution::Done { outcome, retain } => Some((outcome.to_stored(), *retain)),
            Resolution::NotDone => None,
        };
        self.with(|records, now| {
            let seen = |node: &Node| node.token() == seen.as_str() && node.stale(now);
            Ok(match done {
                Some((text, retain)) => records.complete(key, seen, &text, now, retain),
                None => match records.get_mut(key.borrowed()) {
                    Some(node) if seen(node) => {
                        node.state = State::NotDone;
                        true
                    }
                    _ => false,
                },
            })
        })
    }
}
