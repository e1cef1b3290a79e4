//! The store conformance suite against the in-process store.

use std::sync::Arc;

use toolkey::store::{ManualClock, MemoryStore};
use toolkey_tests::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_conforms() {
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    conformance::run(store, Some(clock)).await;
}
