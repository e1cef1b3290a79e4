//! The refund API that does the work and then drops the reply: the code behind
//! `cargo run --example refund`, shared with the integration tests.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolkey::providers::openai;
use toolkey::store::{MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

/// A refund as the API records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Refund {
    /// The API's refund id.
    pub id: String,
    pub order: String,
    pub cents: i64,
}

/// Why a request to the API failed.
#[derive(Debug)]
pub enum ApiError {
    /// The connection dropped before the reply arrived: the API may or may not have acted.
    ReplyLost,
}

/// A fake refund API. It does the work, then drops the first reply. With key support it
/// answers a repeated `Idempotency-Key` with the refund it already made.
pub struct RefundApi {
    refunds: Mutex<Vec<(Refund, Option<String>)>>,
    supports_keys: bool,
    drop_next_reply: AtomicBool,
    delay: Duration,
    next: AtomicU64,
}

impl RefundApi {
    pub fn new(supports_keys: bool, delay: Duration) -> Self {
        RefundApi {
            refunds: Mutex::new(Vec::new()),
            supports_keys,
            drop_next_reply: AtomicBool::new(true),
            delay,
            next: AtomicU64::new(1),
        }
    }

    /// `POST /refunds`, with an optional `Idempotency-Key`.
    pub async fn refund(
        &self,
        order: &str,
        cents: i64,
        key: Option<&str>,
    ) -> Result<Refund, ApiError> {
        tokio::time::sleep(self.delay).await;
        let refund = {
            let mut refunds = self.refunds.lock().unwrap();
            let seen = match (self.supports_keys, key) {
                (true, Some(key)) => refunds
                    .iter()
                    .find(|(_, k)| k.as_deref() == Some(key))
                    .map(|(r, _)| r.clone()),
                _ => None,
            };
            match seen {
                Some(refund) => refund,
                None => {
                    let refund = Refund {
                        id: format!("re_{}", self.next.fetch_add(1, Ordering::SeqCst)),
                        order: order.into(),
                        cents,
                    };
                    refunds.push((refund.clone(), key.map(str::to_string)));
                    refund
                }
            }
        };
        if self.drop_next_reply.swap(false, Ordering::SeqCst) {
            return Err(ApiError::ReplyLost); // the refund is made; the caller never hears of it
        }
        Ok(refund)
    }

    /// `GET /refunds?order=...`: the lookup an API without key support still offers.
    pub async fn find_by_order(&self, order: &str) -> Option<Refund> {
        self.refunds
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| r)
            .find(|r| r.order == order)
            .cloned()
    }

    /// How many refunds the API made.
    pub fn count(&self) -> usize {
        self.refunds.lock().unwrap().len()
    }
}

/// An HTTP client that retries a request whose reply was lost, as most clients do.
pub struct RetryingClient {
    pub api: Arc<RefundApi>,
    pub attempts: usize,
}

impl RetryingClient {
    /// Sends the refund, retrying on a lost reply; `key_for` gives each attempt's key.
    pub async fn refund(
        &self,
        order: &str,
        cents: i64,
        key_for: impl Fn(usize) -> Option<String>,
    ) -> Result<Refund, ApiError> {
        let mut last = None;
        for attempt in 0..self.attempts {
            match self
                .api
                .refund(order, cents, key_for(attempt).as_deref())
                .await
            {
                Ok(refund) => return Ok(refund),
                Err(err) => last = Some(err),
            }
        }
        Err(last.expect("at least one attempt"))
    }
}

fn reply_lost() -> ToolError {
    ToolError::new("REFUND_API_UNREACHABLE", "the refund API did not answer")
        .with_retryable(true)
        .with_suggestion("retry in a moment")
}

/// Refund an order, keyed by the agent run and step, forwarding the key to the API.
#[tool(idempotent(
    key = "refund:<ctx.run_id>:<ctx.step>",
    status = false,
    on_in_progress = "wait(5s)"
))]
pub async fn refund_order(
    client: State<RetryingClient>,
    ctx: &ToolContext,
    /// The order to refund.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Refund, ToolError> {
    let key = ctx.idempotency_key().map(|k| k.to_string());
    client
        .refund(&order, cents, |_| key.clone())
        .await
        .map_err(|_| reply_lost())
}

/// Refund an order through an API without idempotency keys: one attempt, then look before acting.
#[tool(idempotent(key = "refund:<order>", recover = find_refund))]
pub async fn refund_unkeyed_api(
    api: State<RefundApi>,
    /// The order to refund.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Refund, ToolError> {
    // No retry here: without key support, a second request is a second refund.
    api.refund(&order, cents, None)
        .await
        .map_err(|ApiError::ReplyLost| {
            ToolError::outcome_unknown("the refund request went out and its reply was lost")
        })
}

/// Looks the refund up by order: found → that refund is the outcome; not found → safe to act.
pub async fn find_refund(
    api: State<RefundApi>,
    order: String,
    cents: i64,
) -> Result<Option<Refund>, ToolError> {
    let _ = cents;
    Ok(api.find_by_order(&order).await)
}

/// One scenario's name and its count.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub scenario: &'static str,
    pub refunds: usize,
    pub detail: String,
}

/// Runs every scenario; `delay` is the API's latency.
pub async fn run(
    delay: Duration,
    out: &mut dyn Write,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    let mut outcomes = Vec::new();
    let mut report = |out: &mut dyn Write,
                      scenario: &'static str,
                      refunds: usize,
                      detail: String|
     -> std::io::Result<()> {
        writeln!(out, "{scenario:<58} {refunds} refund(s)   {detail}")?;
        outcomes.push(Outcome {
            scenario,
            refunds,
            detail,
        });
        Ok(())
    };

    // 1. No key: the client's retry after the lost reply is a second refund.
    let api = Arc::new(RefundApi::new(true, delay));
    let client = RetryingClient {
        api: api.clone(),
        attempts: 2,
    };
    let refund = client.refund("order-1", 5000, |_| None).await;
    report(
        out,
        "no key",
        api.count(),
        format!("the caller got {:?}", refund.map(|r| r.id)),
    )?;

    // 2. A fresh random key per attempt: each retry looks like a new request.
    let api = Arc::new(RefundApi::new(true, delay));
    let client = RetryingClient {
        api: api.clone(),
        attempts: 2,
    };
    let refund = client
        .refund("order-1", 5000, |_| Some(uuid::Uuid::new_v4().to_string()))
        .await;
    report(
        out,
        "a fresh random key per attempt",
        api.count(),
        format!("the caller got {:?}", refund.map(|r| r.id)),
    )?;

    // 3. toolkey's key from the run and step, forwarded to the API on every attempt. The step
    //    is the call's position in the run's log: here the run's fourth tool call.
    let api = Arc::new(RefundApi::new(true, delay));
    let toolbox = Toolbox::builder()
        .state(RetryingClient {
            api: api.clone(),
            attempts: 2,
        })
        .tool(RefundOrder)
        .build()?;
    let ctx = ToolContext::new("run-42").with_step(3);
    let first = toolbox
        .call(
            "refund_order",
            json!({"order": "order-1", "cents": 5000}),
            &ctx,
        )
        .await?;
    report(
        out,
        "key from run id + step (refund:<ctx.run_id>:<ctx.step>)",
        api.count(),
        format!("the caller got {}", first.value["id"]),
    )?;

    // 4. The same key with another amount: a different action under a name already taken.
    let conflict = toolbox
        .call(
            "refund_order",
            json!({"order": "order-1", "cents": 7000}),
            &ctx,
        )
        .await
        .unwrap_err();
    report(
        out,
        "same key, another amount",
        api.count(),
        format!("{} ({})", conflict.code(), conflict.message()),
    )?;

    // 5. Two concurrent duplicates: the second waits for the first and gets the same refund.
    let api = Arc::new(RefundApi::new(true, delay));
    let toolbox = Toolbox::builder()
        .state(RetryingClient {
            api: api.clone(),
            attempts: 2,
        })
        .tool(RefundOrder)
        .build()?;
    let ctx = ToolContext::new("run-43").with_step(1);
    let args = json!({"order": "order-2", "cents": 2500});
    let (a, b) = tokio::join!(
        toolbox.call("refund_order", args.clone(), &ctx),
        toolbox.call("refund_order", args, &ctx)
    );
    let (a, b) = (a?, b?);
    report(
        out,
        "two concurrent duplicates",
        api.count(),
        format!("both callers got {} and {}", a.value["id"], b.value["id"]),
    )?;

    // 6. An API without key support: the lost reply is recorded as unknown, and the retry looks
    //    the refund up by order before acting again.
    let api = Arc::new(RefundApi::new(false, delay));
    let toolbox = Toolbox::builder()
        .shared_state(api.clone())
        .tool(RefundUnkeyedApi)
        .build()?;
    let ctx = ToolContext::new("run-44");
    let args = json!({"order": "order-3", "cents": 1200});
    let first = toolbox
        .call("refund_unkeyed_api", args.clone(), &ctx)
        .await
        .unwrap_err();
    debug_assert!(first.is(ErrorCode::OutcomeUnknown));
    let retry = toolbox.call("refund_unkeyed_api", args, &ctx).await?;
    report(
        out,
        "no key support, recover hook looks up by order",
        api.count(),
        format!(
            "first call {}, the retry found {}",
            first.code(),
            retry.value["id"]
        ),
    )?;
    // 7. A model asks for a refund in two turns of one conversation, through the OpenAI
    //    adapter, which gives each call its position in the conversation as its step. The
    //    process then dies before saving the second answer; another one picks the run up.
    let api = Arc::new(RefundApi::new(true, delay));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = |store: &Arc<dyn Store>| {
        Toolbox::builder()
            .shared_store(store.clone())
            .state(RetryingClient {
                api: api.clone(),
                attempts: 2,
            })
            .tool(RefundOrder)
            .build()
    };
    let ctx = ToolContext::new("run-45");
    let model_asks = |log: &mut Vec<Value>| {
        // Servers that number call ids per turn send `call_0` in every turn.
        log.push(json!({"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function",
            "function": {"name": "refund_order", "arguments": "{\"order\": \"order-4\", \"cents\": 500}"}}]}));
    };
    let first_process = toolbox(&store)?;
    let mut log = vec![json!({"role": "user", "content": "Refund 5 EUR on order-4."})];
    model_asks(&mut log);
    let turn_one = openai::handle_tool_calls(&first_process, &log, &ctx).await;
    log.extend(turn_one.clone());
    log.push(json!({"role": "user", "content": "I was charged twice: refund another 5 EUR."}));
    model_asks(&mut log);
    let turn_two = openai::handle_tool_calls(&first_process, &log, &ctx).await;
    assert!(first_process.shutdown().await.is_clean());
    let restarted = openai::handle_tool_calls(&toolbox(&store)?, &log, &ctx).await;
    // What the model read: the refund, or a replay wrapping it.
    let read = |answers: &[Value]| {
        let text: Value = answers
            .first()
            .and_then(|answer| answer["content"].as_str())
            .and_then(|content| serde_json::from_str(content).ok())
            .unwrap_or_default();
        match text.get("replayed") {
            Some(_) => format!("{} (a replay)", text["result"]["id"]),
            None => text["id"].to_string(),
        }
    };
    report(
        out,
        "two turns through providers::openai, then a restart",
        api.count(),
        format!(
            "turn one got {}, turn two {}, after the restart {}",
            read(&turn_one),
            read(&turn_two),
            read(&restarted)
        ),
    )?;
    Ok(outcomes)
}
