//! One setup for every run of the store conformance suite: each store says how one of its records
//! is damaged (its `__corrupt` test hook), and [`run`] does the rest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use toolkey::store::{conformance::Suite, ManualClock, MemoryStore, RecordKey, Store};

/// Damaging one record, done.
pub type Damage = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A store whose completed records the suite can damage, to check that a corrupt record is
/// reported and never taken as absent.
pub trait Corruptible: Store + Sized {
    /// Damages the stored outcome of `key`.
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage;
}

/// Runs the conformance suite against `store`: on `clock` when the store runs on one (time passes
/// by advancing it), on the store's own clock otherwise (time passes by sleeping).
pub async fn run<S: Corruptible>(store: Arc<S>, clock: Option<Arc<ManualClock>>) {
    let corrupter = store.clone();
    let suite = Suite::new(store).corrupt_with(move |key| corrupter.clone().corrupt(key));
    match clock {
        Some(clock) => suite.manual_clock(clock).run().await,
        None => suite.run().await,
    }
}

impl Corruptible for MemoryStore {
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage {
        self.__corrupt(&key);
        Box::pin(async {})
    }
}

#[cfg(feature = "sqlite")]
impl Corruptible for toolkey::store::SqliteStore {
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage {
        self.__corrupt(&key);
        Box::pin(async {})
    }
}

#[cfg(feature = "postgres")]
impl Corruptible for toolkey::store::PostgresStore {
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage {
        Box::pin(async move { self.__corrupt(&key).await })
    }
}

#[cfg(feature = "redis")]
impl Corruptible for toolkey::store::RedisStore {
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage {
        Box::pin(async move { self.__corrupt(&key).await })
    }
}

impl<S: Corruptible + Sync> Corruptible for toolkey::store::CachedStore<Arc<S>> {
    fn corrupt(self: Arc<Self>, key: RecordKey) -> Damage {
        self.__forget(&key);
        self.inner().clone().corrupt(key)
    }
}
