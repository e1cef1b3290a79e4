//! Unkeyed tools need an approver and their timeouts are not retryable; read-only timeouts are.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::{tool, BuildError, ErrorCode, State, ToolError, Toolbox};

use super::ctx;

/// Posts a message to a channel (no key: every call posts).
#[tool(unkeyed, timeout = "50ms")]
async fn post_message(posted: State<AtomicUsize>, text: String) -> Result<(), ToolError> {
    let _ = text;
    tokio::time::sleep(Duration::from_millis(100)).await;
    posted.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn unkeyed_tools_need_an_approver_and_their_timeouts_are_not_retryable() {
    let posted = Arc::new(AtomicUsize::new(0));
    let err = Toolbox::builder()
        .shared_state(posted.clone())
        .tool(PostMessage)
        .build()
        .err()
        .unwrap();
    assert_eq!(err, BuildError::NoApprover(vec!["post_message".into()]));

    let refusing = Toolbox::builder()
        .shared_state(posted.clone())
        .tool(PostMessage)
        .approver(|request: &toolkey::ApprovalRequest<'_>| request.arguments["text"] != "spam")
        .build()
        .unwrap();
    let err = refusing
        .call("post_message", json!({"text": "spam"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::ApprovalRequired));
    let err = refusing
        .call("post_message", json!({"text": "hello"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout));
    assert!(!err.is_retryable());
    assert!(err.suggestion().unwrap().contains("do not repeat"));
    assert!(refusing.shutdown().await.is_clean());
    assert_eq!(posted.load(Ordering::SeqCst), 1);
}

/// Looks up the current exchange rate.
#[tool(read_only, timeout = "20ms")]
async fn exchange_rate(currency: String) -> Result<f64, ToolError> {
    let _ = currency;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(1.1)
}

#[tokio::test]
async fn read_only_timeouts_are_retryable() {
    let toolbox = Toolbox::builder().tool(ExchangeRate).build().unwrap();
    let err = toolbox
        .call("exchange_rate", json!({"currency": "USD"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout) && err.is_retryable());
}
