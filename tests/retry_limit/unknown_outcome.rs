//! A retry limit reached while the outcome is unknown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use toolkey::{tool, ErrorCode, State, ToolError, Toolbox};

use super::ctx;

/// A refund provider whose reply is lost after the refund is made, and whose lookup can be down.
#[derive(Default)]
struct Provider {
    refunds: AtomicUsize,
    lookup_down: AtomicBool,
}

/// Refund an order. The provider's reply is lost after the refund is made.
#[tool(
    idempotent(key = "refund:<order>", recover = find_refund),
    retry_limit = "2/10m"
)]
async fn refund(provider: State<Provider>, order: String) -> Result<String, ToolError> {
    let _ = order;
    provider.refunds.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown("the provider's reply was lost"))
}

/// Looks the refund up by order before acting again.
async fn find_refund(
    provider: State<Provider>,
    order: String,
) -> Result<Option<String>, ToolError> {
    if provider.lookup_down.load(Ordering::SeqCst) {
        let down = ToolError::new("LOOKUP_DOWN", "the provider's lookup is down");
        return Err(down.with_retryable(true));
    }
    Ok((provider.refunds.load(Ordering::SeqCst) > 0).then(|| format!("re-{order}")))
}

/// A refund made once, whose reply was lost, then a retry whose lookup could not look: the
/// retry limit is reached with the outcome unknown. The answer stops the model and says the
/// refund may have been made; it once said only that the call "keeps failing", which a user
/// would take as "refund by hand". The call after it, refused before looking, says the same.
#[tokio::test]
async fn a_retry_limit_reached_while_the_outcome_is_unknown_says_the_action_may_have_happened() {
    let provider = Arc::new(Provider::default());
    let toolbox = Toolbox::builder()
        .shared_state(provider.clone())
        .tool(Refund)
        .build()
        .unwrap();
    let args = json!({"order": "o-1"});
    let first = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    let first = first.unwrap_err();
    assert!(
        first.is(ErrorCode::OutcomeUnknown) && first.is_retryable(),
        "{first:?}"
    );
    provider.lookup_down.store(true, Ordering::SeqCst);
    let second = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    let third = toolbox.call("refund", args.clone(), &ctx("acme")).await;
    assert_eq!(provider.refunds.load(Ordering::SeqCst), 1);
    for answer in [second, third] {
        let err = answer.unwrap_err();
        assert!(
            err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
            "{err:?}"
        );
        assert!(
            err.message().contains("whether `refund` acted is unknown"),
            "{err:?}"
        );
        let suggestion = err.suggestion().unwrap();
        assert!(!suggestion.contains("keeps failing"), "{suggestion}");
        assert!(suggestion.contains("it may have been done"), "{suggestion}");
        assert!(suggestion.contains("`refund_status`"), "{suggestion}");
    }
    let status = toolbox.call("refund_status", args, &ctx("acme")).await;
    assert_eq!(status.unwrap().value["status"], "unknown");
}
