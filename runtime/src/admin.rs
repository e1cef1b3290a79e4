//! Operator operations on any store: what is stuck and why, resolving it safely, purging.
//!
//! When a worker dies mid-call its record is left unknown, and a model that calls again is told
//! to ask a person. [`Admin`] is what that person uses (the `toolkey` command-line tool is a thin
//! face on it): [`Admin::list`] shows records by tenant, tool, state and age, [`Admin::show`]
//! one record with its revision, and [`Admin::resolve`] settles an unknown record as done (the
//! model's retry replays the result given) or not done (the retry runs it once). A resolution
//! names the revision the operator saw, and the store refuses it if the record changed since,
//! or is no longer unknown: a worker that was alive after all, or a retry that took the record
//! over, is never overwritten.
//!
//! ```
//! use std::sync::Arc;
//! use toolkey::admin::Admin;
//! use toolkey::store::{EntryState, Filter, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), toolkey::store::StoreError> {
//! let admin = Admin::new(Arc::new(MemoryStore::new()));
//! let stuck = admin
//!     .list(&Filter { state: Some(EntryState::Unknown), ..Filter::default() }, 50)
//!     .await?;
//! assert!(stuck.is_empty());
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::store::{
    Cursor, Entry, EntryState, Filter, RecordKey, Resolution, Store, StoreError, Token, Unreadable,
};

mod approvals;

pub use approvals::DecisionRefused;

/// How many records one page of a listing looks at.
const PAGE: usize = 500;

/// Operator operations on a store. Cheap to clone.
///
/// What it logs names a record's key by hash, and its tenant only when allowed
/// ([`tenant_in_logs`](Self::tenant_in_logs); a toolbox's [`admin`](crate::Toolbox::admin)
/// allows it as [`tenant_in_spans`](crate::ToolboxBuilder::tenant_in_spans) does).
#[derive(Clone)]
pub struct Admin {
    store: Arc<dyn Store>,
    tenant_in_logs: bool,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

/// The shortest time [`Admin::resolve`] keeps a record resolved as done. The model's retry comes
/// after a person answered, minutes or hours later: a record expired by then is absent, and the
/// retry does the work again, which is what resolving it as done was to prevent.
pub const MIN_RETAIN: Duration = Duration::from_secs(60 * 60);

/// What [`Admin::resolve`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// The record was resolved as asked.
    Applied,
    /// Refused before the store was asked, changing nothing: resolved as done, the record would
    /// be kept only `retain`, less than [`MIN_RETAIN`], and a retry after it expired would do
    /// the work again. Resolve it with a retention of at least [`MIN_RETAIN`].
    RetainTooShort {
        /// The retention asked for.
        retain: Duration,
    },
    /// The store refused: the record is not the unknown record that was shown. `now` is what it
    /// is instead (`None`: it is gone); nothing was changed.
    Refused {
        /// The record as it is now.
        now: Option<Box<Entry>>,
    },
}

/// What [`Admin::listing`] found.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Listing {
    /// The records the filter admits.
    pub entries: Vec<Entry>,
    /// The records in the filter's tenant and key that could not be read, whatever its state,
    /// tool or age: left as they are, for a person to repair or delete.
    pub unreadable: Vec<Unreadable>,
}

/// How many records are in each state, per tool.
pub type Counts = BTreeMap<(Option<String>, EntryState), u64>;

impl Admin {
    /// Operator operations on `store`; its logs name tenants by hash.
    pub fn new(store: Arc<dyn Store>) -> Admin {
        Admin {
            store,
            tenant_in_logs: false,
        }
    }

    /// Lets the logs name a record's tenant in clear (`true`), or only by hash (the default):
    /// tenants are often customer names.
    pub fn tenant_in_logs(mut self, on: bool) -> Admin {
        self.tenant_in_logs = on;
        self
    }

    /// Up to `max` records that `filter` admits, in key order within each page. A record in
    /// the filter's scope that cannot be read fails the listing with its
    /// [`StoreError::Corrupt`]; [`listing`](Self::listing) lists the others beside it.
    pub async fn list(&self, filter: &Filter, max: usize) -> Result<Vec<Entry>, StoreError> {
        let listing = self.listing(filter, max).await?;
        match listing.unreadable.first() {
            Some(unreadable) => Err(unreadable.to_error()),
            None => Ok(listing.entries),
        }
    }

    /// Up to `max` records that `filter` admits, in key order within each page, and every record
    /// met on the way that could not be read: one corrupt record hides no other.
    pub async fn listing(&self, filter: &Filter, max: usize) -> Result<Listing, StoreError> {
        let mut listing = Listing::default();
        let mut cursor: Option<Cursor> = None;
        while listing.entries.len() < max {
            let page = self.store.list(filter, cursor.as_ref(), PAGE).await?;
            listing.entries.extend(page.entries);
            listing.unreadable.extend(page.unreadable);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        listing.entries.truncate(max);
        Ok(listing)
    }

    /// One record, with its revision; `None` when there is none (or it expired).
    pub async fn show(&self, key: &RecordKey) -> Result<Option<Entry>, StoreError> {
        let filter = Filter {
            tenant: Some(key.tenant.clone()),
            key: Some(key.key.clone()),
            ..Filter::default()
        };
        Ok(self.list(&filter, 1).await?.pop())
    }

    /// Resolves the unknown record `key` as `resolution`, if it still is the record seen at
    /// revision `seen` and still unknown; otherwise changes nothing and says what it is now. A
    /// record resolved as done is kept at least [`MIN_RETAIN`]: a shorter retention is refused.
    pub async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        if let Resolution::Done { retain, .. } = resolution {
            if *retain < MIN_RETAIN {
                return Ok(Resolved::RetainTooShort { retain: *retain });
            }
        }
        if self.store.resolve(key, seen, resolution).await? {
            let done = matches!(resolution, Resolution::Done { .. });
            let key_hash = crate::key::log_hash(&key.key);
            if self.tenant_in_logs {
                tracing::info!(tenant = %key.tenant, key = %key_hash, done, "an operator resolved an unknown record");
            } else {
                let tenant_hash = crate::key::log_hash(&key.tenant);
                tracing::info!(tenant_hash = %tenant_hash, key = %key_hash, done, "an operator resolved an unknown record");
            }
            return Ok(Resolved::Applied);
        }
        Ok(Resolved::Refused {
            now: self.show(key).await?.map(Box::new),
        })
    }

    /// Deletes every expired record, `batch` at a time, calling `progress` with the running
    /// total after each batch. Between batches the store is free: calls keep being answered
    /// while a large purge runs.
    pub async fn purge(
        &self,
        batch: usize,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            let purged = self.store.purge_expired(batch).await?;
            total += purged;
            progress(total);
            if purged < batch as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// How many records `filter` admits, by tool and state. Reads every admitted record.
    pub async fn counts(&self, filter: &Filter) -> Result<Counts, StoreError> {
        let mut counts = Counts::new();
        let mut cursor: Option<Cursor> = None;
        loop {
            let page = self.store.list(filter, cursor.as_ref(), PAGE).await?;
            if let Some(unreadable) = page.unreadable.first() {
                return Err(unreadable.to_error());
            }
            for entry in page.entries {
                *counts.entry((entry.tool, entry.state)).or_default() += 1;
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(counts),
            }
        }
    }

    /// The store's clock, against which ages and leases are judged.
    pub async fn now(&self) -> Result<SystemTime, StoreError> {
        self.store.now().await
    }
}
