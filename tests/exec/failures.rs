//! Failures outside the body: a panic there is an unknown outcome, never a second run, and an
//! unreachable store fails closed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use toolkey::store::{
    FailureCounters, MemoryStore, OperatorCommands, Outcome, Record, RecordKey, Reservation,
    Reservations, StoreError, Token,
};
use toolkey::{ErrorCode, Fingerprint, Toolbox};
use toolkey_tests::billing;

use billing::Billing;

use super::{ctx, invoice};

/// A panic outside the body (here, the store's while recording the outcome) ends a call that
/// runs in its caller's task with `OUTCOME_UNKNOWN`: the body ran, and nothing recorded it. The
/// reservation holds the key until its lease lapses, and then reads as unknown: never run twice.
#[tokio::test]
async fn a_panic_outside_the_body_is_an_unknown_outcome_never_a_second_run() {
    use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
    let billing = Arc::new(Billing::default());
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        Plan::script([(Op::Complete, Fault::Panic)]),
    ));
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(billing.clone())
        .tool(billing::SendInvoiceBriefLease)
        .build()
        .unwrap();
    let args = invoice("acme", "2026-10", 100.0, "");
    let err = toolbox
        .call("send_invoice", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(billing.count(), 1);
    let err = toolbox
        .call("send_invoice", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = toolbox
        .call("send_invoice", args, &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert_eq!(billing.count(), 1);
    assert_eq!(store.injected().failed_before, 1);
}

/// A store that cannot be reached.
struct Down;

#[async_trait]
impl Reservations for Down {
    async fn reserve(
        &self,
        _: &RecordKey,
        _: &str,
        _: &Fingerprint,
        _: &Token,
        _: Duration,
    ) -> Result<Reservation, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn complete(
        &self,
        _: &RecordKey,
        _: &Token,
        _: &Outcome,
        _: Duration,
    ) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn release(&self, _: &RecordKey, _: &Token) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn renew(&self, _: &RecordKey, _: &Token, _: Duration) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn mark_unknown(&self, _: &RecordKey, _: &Token) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn take_over(
        &self,
        _: &RecordKey,
        _: &Token,
        _: Duration,
    ) -> Result<Option<Token>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

#[async_trait]
impl OperatorCommands for Down {
    async fn purge_expired(&self, _: usize) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn now(&self) -> Result<std::time::SystemTime, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

#[async_trait]
impl FailureCounters for Down {
    async fn count_failure(&self, _: &RecordKey, _: Duration) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn failures(&self, _: &RecordKey) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn clear_failures(&self, _: &RecordKey) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

/// Keeps no approval requests: no tool here needs one.
impl toolkey::store::Approvals for Down {}

#[tokio::test]
async fn an_unreachable_store_fails_closed() {
    let billing = Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .store(Down)
        .shared_state(billing.clone())
        .tool(billing::SendInvoice)
        .shutdown_grace(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = toolbox
        .call(
            "send_invoice",
            invoice("acme", "2026-10", 100.0, "October"),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::StoreUnavailable), "{err:?}");
    assert!(err.is_retryable());
    let err = toolbox
        .call(
            "invoice_status",
            json!({"customer": "acme", "period": "2026-10"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::StoreUnavailable));
    // The refused reserve may have been written with its reply lost: freeing it is retried
    // while the store stays down, and shutdown says so.
    let report = toolbox.shutdown().await;
    assert_eq!(report.unrecorded.len(), 1, "{report:?}");
    assert_eq!(report.unrecorded[0].write, "release");
    assert_eq!(billing.count(), 0);
}
