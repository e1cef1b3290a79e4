//! The store conformance suite against the in-process store.

use std::sync::Arc;

use toolkey::store::{conformance::Suite, ManualClock, MemoryStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_conforms() {
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let corrupter = store.clone();
    Suite::new(store)
        .manual_clock(clock)
        .corrupt_with(move |key| {
            corrupter.__corrupt(&key);
            async {}
        })
        .run()
        .await;
}
