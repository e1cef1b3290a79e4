//! The records as the store keeps them: one table of nodes, tool names shared.

use super::*;

/// The records, each boxed so a slot of the table is its hash and a pointer, found by their
/// tenant and key without building a [`RecordKey`].
#[derive(Default)]
pub(super) struct Records {
    pub(super) table: Table<Node>,
    /// foldhash with a seed of this table's own (hashbrown's default): a key is hashed on each
    /// reserve, completion and replay, and SipHash, the standard library's, took 341
    /// instructions for the call bench's key where foldhash takes 64. Keys hold text from the
    /// model's arguments: foldhash is not a cryptographic hash, and resists a flood of keys
    /// chosen to collide only while its seed, random per table and shown by nothing here, stays
    /// unknown.
    pub(super) hasher: hashbrown::DefaultHashBuilder,
    pub(super) tools: ToolNames,
}

/// Each tool's name once, shared by its records.
#[derive(Default)]
pub(super) struct ToolNames {
    pub(super) held: HashSet<Arc<str>>,
    /// The name asked for last.
    pub(super) last: Option<Arc<str>>,
}

impl ToolNames {
    /// The shared copy of a tool's name.
    pub(super) fn shared(&mut self, name: &str) -> Arc<str> {
        // Calls of one tool often come in a row: its name is compared before it is hashed.
        if let Some(last) = self.last.as_ref().filter(|last| ***last == *name) {
            return last.clone();
        }
        let held = match self.held.get(name) {
            Some(held) => held.clone(),
            None => {
                let name: Arc<str> = name.into();
                self.held.insert(name.clone());
                name
            }
        };
        self.last = Some(held.clone());
        held
    }
}

impl Records {
    pub(super) fn hash(&self, tenant: &str, key: &str) -> u64 {
        self.hasher.hash_one((tenant, key))
    }

    /// The record under `key`, to change.
    pub(super) fn get_mut(&mut self, key: RecordKeyRef<'_>) -> Option<&mut Node> {
        let hash = self.hash(key.tenant, key.key);
        self.table.find_mut(hash, |node| node.is(key))
    }

    /// Removes the record under `key` if `judge` says so; true when it did.
    pub(super) fn remove_if(&mut self, key: &RecordKey, judge: impl FnOnce(&Node) -> bool) -> bool {
        let hash = self.hash(&key.tenant, &key.key);
        self.table
            .remove_if(hash, |node| node.is(key.borrowed()), judge)
    }

    /// Completes the record under `key`, if `judge` says so, with the outcome whose stored text
    /// is `text` (written before the lock is taken); true when it did.
    pub(super) fn complete(
        &mut self,
        key: &RecordKey,
        judge: impl FnOnce(&Node) -> bool,
        text: &str,
        now_ms: i64,
        retain: Duration,
    ) -> bool {
        let hash = self.hash(&key.tenant, &key.key);
        let node = self.table.find_mut(hash, |node| node.is(key.borrowed()));
        let Some(node) = node.filter(|node| judge(node)) else {
            return false;
        };
        node.state = State::Completed;
        node.completed_at_ms = now_ms;
        node.expires_at_ms = now_ms.saturating_add(span_ms(retain));
        node.hold_text(text);
        true
    }
}

/// One record. Times are milliseconds; `completed_at_ms` and `expires_at_ms` mean something only
/// in a completed record.
pub(super) struct Node {
    /// The tenant, the key, the holder's token and, in a completed record, the outcome's stored
    /// text, one after another.
    pub(super) text: Box<str>,
    pub(super) tenant_len: u32,
    pub(super) key_len: u32,
    pub(super) token_len: u32,
    pub(super) state: State,
    pub(super) tool: Option<Arc<str>>,
    pub(super) fingerprint: Fingerprint,
    pub(super) since_ms: i64,
    pub(super) lease_until_ms: i64,
    pub(super) completed_at_ms: i64,
    pub(super) expires_at_ms: i64,
    /// A completed record's outcome as a read found it, kept so that the reads after it (a
    /// retry's replay, above all) copy it rather than read the text again: copying the call
    /// bench's result took 1,500 instructions where reading its text took 4,100. Kept only for
    /// text up to [`KEEP_READ`] bytes that nests no deeper than serde_json reads unaided;
    /// dropped whenever the text changes.
    pub(super) read: Option<Box<Outcome>>,
}

/// The longest outcome text whose reading a record keeps (see [`Node::record`]): what a record
/// can hold beyond its text stays bounded, and a longer text costs more to read or copy than a
/// replay's other work, whichever is done.
pub(super) const KEEP_READ: usize = 4 * 1024;

/// The deepest nesting of an outcome whose reading a record keeps: copying it recurses once
/// per level, as serde_json's own bounded reading does.
pub(super) const KEEP_READ_DEPTH: usize = 128;

impl Node {
    /// A record reserved under `token` at `now_ms`, its tool's name not yet set.
    pub(super) fn reserved(
        key: &RecordKey,
        fingerprint: &Fingerprint,
        token: &Token,
        now_ms: i64,
        lease: Duration,
    ) -> Result<Node, StoreError> {
        let too_long = |_| StoreError::Config("a tenant or key longer than 4 GiB".into());
        Ok(Node {
            text: [key.tenant.as_str(), &key.key, token.as_str()]
                .concat()
                .into(),
            tenant_len: u32::try_from(key.tenant.len()).map_err(too_long)?,
            key_len: u32::try_from(key.key.len()).map_err(too_long)?,
            token_len: u32::try_from(token.as_str().len()).map_err(too_long)?,
            state: State::InProgress,
            tool: None,
            fingerprint: *fingerprint,
            since_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(span_ms(lease)),
            completed_at_ms: 0,
            expires_at_ms: 0,
            read: None,
        })
    }

    pub(super) fn tenant(&self) -> &str {
        &self.text[..self.tenant_len as usize]
    }

    pub(super) fn key(&self) -> &str {
        let start = self.tenant_len as usize;
        &self.text[start..start + self.key_len as usize]
    }

    pub(super) fn token(&self) -> &str {
        let start = self.token_start();
        &self.text[start..start + self.token_len as usize]
    }

    /// Where the token starts in `text`. (The lengths are added as `usize`: each fits in a
    /// `u32`, their sum need not.)
    pub(super) fn token_start(&self) -> usize {
        self.tenant_len as usize + self.key_len as usize
    }

    /// Where the outcome's text starts in `text`.
    pub(super) fn outcome_start(&self) -> usize {
        self.token_start() + self.token_len as usize
    }

    /// The outcome's stored text, after the token (none in a record not completed).
    pub(super) fn outcome(&self) -> Option<&str> {
        (self.state == State::Completed).then(|| &self.text[self.outcome_start()..])
    }

    /// Holds `stored` as the outcome's text, in place of any outcome held before.
    pub(super) fn hold_text(&mut self, stored: &str) {
        let start = self.outcome_start();
        self.text = [&self.text[..start], stored].concat().into();
        self.read = None;
    }

    pub(super) fn is(&self, key: RecordKeyRef<'_>) -> bool {
        self.tenant() == key.tenant && self.key() == key.key
    }

    pub(super) fn record_key(&self) -> RecordKey {
        RecordKey::new(self.tenant(), self.key())
    }

    /// Hands the record to a new holder.
    pub(super) fn set_token(&mut self, token: &Token) -> Result<(), StoreError> {
        let held = self.token_start();
        let rest = &self.text[self.outcome_start()..];
        let token_len = u32::try_from(token.as_str().len())
            .map_err(|_| StoreError::Config("a token longer than 4 GiB".into()))?;
        self.text = [&self.text[..held], token.as_str(), rest].concat().into();
        self.token_len = token_len;
        Ok(())
    }

    /// A completed record past its retention: purged.
    pub(super) fn expired(&self, now_ms: i64) -> bool {
        self.state == State::Completed && self.expires_at_ms <= now_ms
    }

    /// Expired, or resolved as not done by an operator: absent to `reserve`, `get` and listings.
    pub(super) fn absent(&self, now_ms: i64) -> bool {
        self.state == State::NotDone || self.expired(now_ms)
    }

    /// In progress with a lapsed lease, or marked unknown: nobody knows the outcome.
    pub(super) fn stale(&self, now_ms: i64) -> bool {
        self.state == State::Unknown
            || (self.state == State::InProgress && self.lease_until_ms <= now_ms)
    }

    /// In progress under `token`, or resolved as not done while `token` held it: the states in
    /// which a fenced write applies. A holder an operator judged dead that was alive after all
    /// records what it did, until another call reserves the key.
    pub(super) fn held_by(&self, token: &Token) -> bool {
        matches!(self.state, State::InProgress | State::NotDone) && self.token() == token.as_str()
    }

    /// Completed under `token` with the outcome stored as `text`: what a `complete` sent again
    /// finds when the first one landed.
    pub(super) fn completed_by(&self, token: &Token, text: &str) -> bool {
        self.token() == token.as_str() && self.outcome() == Some(text)
    }

    /// The record as the trait describes it, at `now_ms`. A completed record's outcome is
    /// copied from the reading kept by an earlier call, if there is one; else read from its
    /// text, and that reading kept when the text is short and shallow enough.
    pub(super) fn record(&mut self, key: &RecordKey, now_ms: i64) -> Result<Record, StoreError> {
        if let Some(record) = self.kept_record() {
            return Ok(record);
        }
        let record = self.fields().to_record(key, now_ms)?;
        if let Record::Completed { outcome, .. } = &record {
            let text = &self.text[self.outcome_start()..];
            if text.len() <= KEEP_READ && nesting(text) <= KEEP_READ_DEPTH {
                self.read = Some(Box::new(outcome.clone()));
            }
        }
        Ok(record)
    }

    /// The completed record, its outcome copied from the reading kept by an earlier read; none
    /// when no reading is kept.
    pub(super) fn kept_record(&self) -> Option<Record> {
        let read = self
            .read
            .as_ref()
            .filter(|_| self.state == State::Completed)?;
        Some(Record::Completed {
            fingerprint: self.fingerprint,
            outcome: Outcome::clone(read),
            completed_at: from_millis(self.completed_at_ms),
            expires_at: from_millis(self.expires_at_ms),
        })
    }

    pub(super) fn fields(&self) -> Fields<'_> {
        let completed = self.state == State::Completed;
        Fields {
            tool: self.tool.as_deref(),
            state: self.state,
            token: self.token(),
            fingerprint: self.fingerprint,
            since_ms: self.since_ms,
            lease_until_ms: self.lease_until_ms,
            outcome: self.outcome(),
            completed_at_ms: completed.then_some(self.completed_at_ms),
            expires_at_ms: completed.then_some(self.expires_at_ms),
        }
    }
}
