//! The call path: reserve, the fenced writes, take-over and reads.

use super::*;

#[async_trait]
impl Reservations for MemoryStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.with(|records, now| {
            let hash = records.hash(&key.tenant, &key.key);
            // The record is built while the probe's cache line is on its way (in a large
            // table, a miss), and dropped again in the rare case the key is taken: a replay
            // in memory is answered before a reserve (`completed_here`).
            records.table.prefetch(hash);
            let mut node = Node::reserved(key, fingerprint, token, now, lease)?;
            let Records { table, tools, .. } = records;
            let place = match table.entry(hash, |held| held.is(key.borrowed())) {
                Entry::Held(held) if !held.absent(now) => {
                    return Ok(Reservation::Existing(held.record(key, now)?));
                }
                place => place,
            };
            // Only a record kept shares its tool's name: a reserve that stores nothing adds no
            // name to the store's set of them.
            node.tool = Some(tools.shared(tool));
            match place {
                Entry::Held(absent) => *absent = node,
                Entry::Free(free) => free.insert(node),
            }
            Ok(Reservation::Reserved {
                token: token.clone(),
                failures: self.failures_at(key, now),
            })
        })
    }

    fn completed_here(&self, key: RecordKeyRef<'_>) -> Option<Record> {
        let mut records = self.records();
        let node = records.get_mut(key)?;
        if node.state != State::Completed {
            return None;
        }
        // The clock is read only for a completed record, whose expiry it decides: a first call
        // (no record yet) asks before every reserve, and reads the clock there.
        let now = self.now_ms();
        if node.expired(now) {
            return None;
        }
        // Read once, then copied: only the first read needs a key of its own. A record that
        // cannot be read is left to `reserve`, which reports it.
        node.kept_record()
            .or_else(|| node.record(&RecordKey::from(key), now).ok())
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let text = outcome.to_stored();
        self.with(|records, now| {
            if records.complete(key, |node| node.held_by(token), &text, now, retain) {
                return Ok(true);
            }
            Ok(records
                .get_mut(key.borrowed())
                .is_some_and(|node| node.completed_by(token, &text)))
        })
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        Ok(self.records().remove_if(key, |node| node.held_by(token)))
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if node.held_by(token) => {
                node.state = State::InProgress;
                node.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        match self.records().get_mut(key.borrowed()) {
            Some(node) if node.held_by(token) => {
                node.state = State::Unknown;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if node.token() == stale.as_str() && node.stale(now) => {
                let token = Token::generate();
                node.set_token(&token)?;
                node.state = State::InProgress;
                node.since_ms = now;
                node.lease_until_ms = now.saturating_add(span_ms(lease));
                Ok(Some(token))
            }
            _ => Ok(None),
        })
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with(|records, now| match records.get_mut(key.borrowed()) {
            Some(node) if !node.absent(now) => node.record(key, now).map(Some),
            _ => Ok(None),
        })
    }
}
