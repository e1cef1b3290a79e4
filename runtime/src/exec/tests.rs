//! The executor driven directly, without a toolbox: a hand-written keyed call against a fake
//! ledger, each scenario ending with an exact count of the ledger's effects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;

use super::{Executor, ToolOutput};
use crate::context::StateMap;
use crate::key::KeyBuilder;
use crate::observe::ToolTelemetry;
use crate::store::{MemoryStore, Store};
use crate::story::Story;
use crate::tool::{Body, Call, Settings, Tool, ToolDefinition};
use crate::{ErrorCode, Fingerprint, ToolContext, ToolError};

/// The outside system: counts the invoices it sent. `gate`, when set, holds every send until
/// it is opened.
#[derive(Default)]
struct Ledger {
    sent: AtomicUsize,
    gate: Option<Notify>,
}

impl Ledger {
    fn gated() -> Arc<Ledger> {
        Arc::new(Ledger {
            sent: AtomicUsize::new(0),
            gate: Some(Notify::new()),
        })
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

fn executor() -> Arc<Executor> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    Arc::new(Executor::new(
        store,
        Arc::new(StateMap::default()),
        None,
        Duration::from_secs(5),
        Default::default(),
    ))
}

fn definition(story: Story, timeout: Option<Duration>) -> Arc<ToolDefinition> {
    let settings = Settings {
        timeout,
        ..Settings::default()
    };
    Arc::new(
        ToolDefinition::new("send_invoice", "Sends one invoice.", json!({}), story)
            .with_settings(settings),
    )
}

/// The body: sends one invoice on `ledger` (once its gate, if any, opens) and returns its number.
fn send(ledger: &Arc<Ledger>) -> Body {
    let ledger = ledger.clone();
    Box::new(move |_invocation| {
        Box::pin(async move {
            if let Some(gate) = &ledger.gate {
                gate.notified().await;
            }
            let number = ledger.sent.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<Value, ToolError>(json!({ "invoice": number }))
        })
    })
}

/// What `#[tool(idempotent(key = "invoice:<customer>"))]` prepares for `(customer, amount)`.
fn keyed(ledger: &Arc<Ledger>, customer: &str, amount: u64) -> Call {
    let mut key = KeyBuilder::new("invoice:", "");
    key.part(customer, "customer");
    let fingerprint = Fingerprint::of(&json!({ "customer": customer, "amount": amount })).unwrap();
    Call::keyed(key.finish().unwrap(), fingerprint, send(ledger))
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

#[tokio::test]
async fn a_keyed_call_runs_once_and_its_retry_replays() {
    let (exec, ledger) = (executor(), Arc::new(Ledger::default()));
    let def = definition(Story::Idempotent, None);

    let first = exec
        .run(def.clone(), keyed(&ledger, "acme", 100), &ctx())
        .await
        .unwrap();
    assert_eq!(
        first,
        ToolOutput {
            value: json!({"invoice": 1}),
            replayed: false
        }
    );
    let retry = exec
        .run(def.clone(), keyed(&ledger, "acme", 100), &ctx())
        .await
        .unwrap();
    assert_eq!(
        retry,
        ToolOutput {
            value: json!({"invoice": 1}),
            replayed: true
        }
    );

    // Same key, other arguments: a conflict, never a replay of another action's result.
    let other = exec
        .run(def.clone(), keyed(&ledger, "acme", 999), &ctx())
        .await
        .unwrap_err();
    assert!(other.is(ErrorCode::Conflict), "{other:?}");
    // Another tenant's record is not this one's.
    let elsewhere = exec
        .run(
            def,
            keyed(&ledger, "acme", 100),
            &ToolContext::new("run-1").with_tenant("globex"),
        )
        .await
        .unwrap();
    assert!(!elsewhere.replayed);

    assert_eq!(ledger.sent(), 2);
    let stats = exec.stats();
    assert_eq!((stats.executed, stats.replayed, stats.conflicts), (2, 1, 1));
}

#[tokio::test]
async fn a_caller_that_stops_waiting_leaves_the_body_running_and_a_retry_replays_it() {
    let (exec, ledger) = (executor(), Ledger::gated());
    let def = definition(Story::Idempotent, Some(Duration::from_millis(50)));

    let first = exec
        .run(def.clone(), keyed(&ledger, "acme", 100), &ctx())
        .await
        .unwrap_err();
    assert!(
        first.is(ErrorCode::Timeout) && first.is_retryable(),
        "{first:?}"
    );
    let during = exec
        .run(def.clone(), keyed(&ledger, "acme", 100), &ctx())
        .await
        .unwrap_err();
    assert!(during.is(ErrorCode::InProgress), "{during:?}");

    ledger.gate.as_ref().unwrap().notify_one();
    assert!(exec.shutdown().await.is_clean());
    let after = exec
        .run(def, keyed(&ledger, "acme", 100), &ctx())
        .await
        .unwrap();
    assert_eq!(
        after,
        ToolOutput {
            value: json!({"invoice": 1}),
            replayed: true
        }
    );
    assert_eq!(ledger.sent(), 1);
    assert_eq!(exec.stats().timeouts, 1);
}

#[tokio::test]
async fn a_call_without_a_key_runs_every_time() {
    let (exec, ledger) = (executor(), Arc::new(Ledger::default()));
    let def = definition(Story::Natural, None);
    for n in 1..=3 {
        let out = exec
            .run(def.clone(), Call::unkeyed(send(&ledger)), &ctx())
            .await
            .unwrap();
        assert_eq!(out.value, json!({ "invoice": n }));
        assert!(!out.replayed);
    }
    assert_eq!(ledger.sent(), 3);
}

/// An `unkeyed` tool, written by hand as `#[tool]` would write it.
struct Wire(Arc<Ledger>);

impl Tool for Wire {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new("wire", "Wires money.", json!({}), Story::Unkeyed)
    }

    fn prepare(&self, _args: &Value, _ctx: &ToolContext) -> Result<Call, ToolError> {
        Ok(Call::unkeyed(send(&self.0)))
    }
}

#[tokio::test]
async fn an_unkeyed_call_runs_only_when_approved() {
    let ledger = Arc::new(Ledger::default());
    let tool = Wire(ledger.clone());
    let def = Arc::new(tool.definition());

    let refused = executor()
        .call(
            &tool,
            &def,
            &ToolTelemetry::new("wire"),
            json!({"to": "x"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(refused.is(ErrorCode::ApprovalRequired), "{refused:?}");

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let approving = Arc::new(Executor::new(
        store,
        Arc::new(StateMap::default()),
        Some(Arc::new(|request: &super::ApprovalRequest<'_>| {
            request.tool == "wire" && request.arguments["to"] == "x"
        })),
        Duration::from_secs(5),
        Default::default(),
    ));
    approving
        .call(
            &tool,
            &def,
            &ToolTelemetry::new("wire"),
            json!({"to": "x"}),
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(ledger.sent(), 1);
}

/// The texts of every refusal the keyed path answers with name the tool, never the values that
/// made the key or the arguments.
#[tokio::test]
async fn no_answer_carries_a_key_value_or_an_argument() {
    const SECRET: &str = "jane.doe@example.com";
    let (exec, ledger) = (executor(), Ledger::gated());
    let def = definition(Story::Idempotent, Some(Duration::from_millis(50)));
    let mut answers = Vec::new();
    for amount in [100, 100, 999] {
        answers.push(
            exec.run(def.clone(), keyed(&ledger, SECRET, amount), &ctx())
                .await
                .unwrap_err(),
        );
    }
    let codes: Vec<&str> = answers.iter().map(ToolError::code).collect();
    assert_eq!(codes, ["TIMEOUT", "IN_PROGRESS", "CONFLICT"]);
    for answer in &answers {
        let text = answer.to_json().to_string();
        assert!(!text.contains(SECRET) && !text.contains("999"), "{text}");
    }
    ledger.gate.as_ref().unwrap().notify_one();
    assert!(exec.shutdown().await.is_clean());
    assert_eq!(ledger.sent(), 1);
}
