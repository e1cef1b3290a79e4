//! What an operator sees of the calls: one `execute_tool` span per call with what happened, a
//! child span per `ctx.once` step, and the metrics — and never an argument's value, a key's text,
//! a run id or (unless the toolbox allows it) a tenant.
//!
//! Every scenario runs on a current-thread runtime under a subscriber and a metrics recorder
//! local to its thread, so tests running at once never see each other's calls.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use serde_json::{json, Value};
use toolkey::observe::{
    BODIES_IN_FLIGHT, CALLS, CALL_DURATION, CALL_SPAN, STEP_SPAN, STORE_DURATION,
};
use toolkey::providers::{anthropic, openai};
use toolkey::store::MemoryStore;
use toolkey::{tool, State, Stats, ToolContext, ToolError, Toolbox};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Values that must never reach a span or an event: arguments, results, error messages built
/// from arguments, the run id and the tenant.
const SECRETS: &[&str] = &[
    "acme-secret-7781",
    "period-secret-0042",
    "memo-secret-4411",
    "blocked-secret-9093",
    "order-secret-6120",
    "run-secret-5150",
    "tenant-secret-3301",
];

// ---------------------------------------------------------------------------------------------
// The fake outside system and its tools.

/// Counts every effect the tools have.
#[derive(Default)]
struct Ledger {
    invoices: Mutex<Vec<String>>,
    refunds_tried: AtomicUsize,
    drafts: AtomicUsize,
    sends: AtomicUsize,
    send_fails_once: AtomicBool,
    flags: AtomicUsize,
    wires: AtomicUsize,
    charges_tried: AtomicUsize,
    exports: AtomicUsize,
    /// Reads of `watch_balance` begun, and ended.
    watches: AtomicUsize,
    watched: AtomicUsize,
    /// Set to end the watches waiting.
    watch_ends: tokio::sync::Notify,
}

/// Send one invoice; a blocked customer's card is declined.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"))]
async fn send_invoice(
    ledger: State<Ledger>,
    customer: String,
    period: String,
    amount: i64,
    #[arg(ignore)] memo: String,
) -> Result<String, ToolError> {
    if customer.starts_with("blocked") {
        return Err(ToolError::new(
            "PAYMENT_DECLINED",
            format!("the card of {customer} was declined"),
        )
        .with_retryable(false));
    }
    let invoice = format!("invoice for {customer}, {period}: {amount} ({memo})");
    ledger.invoices.lock().unwrap().push(invoice.clone());
    Ok(invoice)
}

/// Send an invoice through a slow billing system: the caller stops waiting after 50 ms.
#[tool(idempotent(key = "late:<customer>"), timeout = "50ms", lease = "60ms")]
async fn late_invoice(ledger: State<Ledger>, customer: String) -> Result<String, ToolError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    ledger.invoices.lock().unwrap().push(customer.clone());
    Ok(customer)
}

/// Refund an order; the refund system's reply is lost.
#[tool(idempotent(key = "refund:<order>"))]
async fn unsure_refund(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.refunds_tried.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown(format!(
        "the reply for {order} was lost"
    )))
}

/// Draft and send an order confirmation, each step at most once; the first send fails.
#[tool(idempotent(key = "order:<order>"))]
async fn confirm_order(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    let draft: String = ctx
        .once("draft", async {
            ledger.drafts.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(format!("draft of {order}"))
        })
        .await?;
    if ledger.send_fails_once.swap(false, Ordering::SeqCst) {
        return Err(
            ToolError::new("MAIL_DOWN", format!("could not mail {order}")).with_retryable(true),
        );
    }
    ctx.once("send", async {
        ledger.sends.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ToolError>(draft.clone())
    })
    .await
}

/// Look up a customer's balance.
#[tool(read_only)]
async fn peek_balance(customer: String) -> Result<String, ToolError> {
    Ok(format!("balance of {customer}: 0"))
}

/// Wait for a customer's balance to change, and read it.
#[tool(read_only)]
async fn watch_balance(ledger: State<Ledger>, customer: String) -> Result<String, ToolError> {
    ledger.watches.fetch_add(1, Ordering::SeqCst);
    ledger.watch_ends.notified().await;
    ledger.watched.fetch_add(1, Ordering::SeqCst);
    Ok(format!("balance of {customer}: 1"))
}

/// Turn a customer's paperless flag on.
#[tool(natural)]
async fn set_paperless(ledger: State<Ledger>, customer: String) -> Result<bool, ToolError> {
    let _ = customer;
    ledger.flags.fetch_add(1, Ordering::SeqCst);
    Ok(true)
}

/// Wire money to an account.
#[tool(unkeyed)]
async fn wire(ledger: State<Ledger>, account: String) -> Result<String, ToolError> {
    ledger.wires.fetch_add(1, Ordering::SeqCst);
    Ok(format!("wired to {account}"))
}

/// Charge an order; the payment gateway is down. Two failures within ten minutes are enough.
#[tool(idempotent(key = "charge:<order>"), retry_limit = "2/10m")]
async fn charge(ledger: State<Ledger>, order: String) -> Result<String, ToolError> {
    ledger.charges_tried.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::new("GATEWAY_DOWN", format!("could not charge {order}")).with_retryable(true))
}

/// Export a report, one at a time; the caller waits 50 ms.
#[tool(read_only, concurrency = 1, timeout = "50ms")]
async fn export_report(ledger: State<Ledger>, name: String) -> Result<String, ToolError> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    ledger.exports.fetch_add(1, Ordering::SeqCst);
    Ok(name)
}

fn toolbox(ledger: &Arc<Ledger>, tenant_in_spans: bool) -> Toolbox {
    Toolbox::builder()
        .store(MemoryStore::new())
        .shared_state(ledger.clone())
        .tool(SendInvoice)
        .tool(LateInvoice)
        .tool(UnsureRefund)
        .tool(ConfirmOrder)
        .tool(PeekBalance)
        .tool(WatchBalance)
        .tool(SetPaperless)
        .tool(Wire)
        .approver(|request: &toolkey::ApprovalRequest<'_>| {
            request.arguments["account"] != "blocked-secret-9093"
        })
        .tenant_in_spans(tenant_in_spans)
        .build()
        .unwrap()
}

fn ctx() -> ToolContext {
    ToolContext::new("run-secret-5150").with_tenant("tenant-secret-3301")
}

// ---------------------------------------------------------------------------------------------
// A subscriber that keeps every span and event with its fields, and a recorder.

#[derive(Debug, Clone)]
struct SpanSeen {
    name: &'static str,
    parent: Option<usize>,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
struct EventSeen {
    span: Option<usize>,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Seen {
    spans: Arc<Mutex<Vec<SpanSeen>>>,
    events: Arc<Mutex<Vec<EventSeen>>>,
    /// Open spans by their id (ids are reused once a span closes) to their index in `spans`.
    open: Arc<Mutex<HashMap<u64, usize>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let open = self.open.lock().unwrap();
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .and_then(|parent| open.get(&parent.id().into_u64()).copied());
        drop(open);
        let mut spans = self.spans.lock().unwrap();
        spans.push(SpanSeen {
            name: attrs.metadata().name(),
            parent,
            fields,
        });
        self.open
            .lock()
            .unwrap()
            .insert(id.into_u64(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let Some(&index) = self.open.lock().unwrap().get(&id.into_u64()) else {
            return;
        };
        values.record(&mut Fields(&mut self.spans.lock().unwrap()[index].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let span = ctx.event_span(event).and_then(|span| {
            self.open
                .lock()
                .unwrap()
                .get(&span.id().into_u64())
                .copied()
        });
        self.events.lock().unwrap().push(EventSeen { span, fields });
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        self.open.lock().unwrap().remove(&id.into_u64());
    }
}

/// Runs `scenario` on a current-thread runtime under a capturing subscriber and `recorder`, both
/// local to this thread.
///
/// Every test here runs under a subscriber of its own: with one thread-local subscriber alive,
/// `tracing` asks only the current thread's whether a callsite is enabled, and a test thread
/// without one would switch an event off for every thread.
fn observed<Fut: Future<Output = ()>>(
    recorder: &DebuggingRecorder,
    scenario: impl FnOnce() -> Fut,
) -> Seen {
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(recorder, || runtime.block_on(scenario()))
    });
    seen
}

// ---------------------------------------------------------------------------------------------
// The scripted run: every outcome, every story, steps, adapters.

fn invoice(customer: &str, amount: i64) -> Value {
    json!({"customer": customer, "period": "period-secret-0042", "amount": amount, "memo": "memo-secret-4411"})
}

async fn every_outcome(toolbox: &Toolbox, ledger: &Ledger) {
    let ctx = ctx();
    let call = |name: &'static str, args: Value| {
        let ctx = ctx.clone();
        async move { toolbox.call(name, args, &ctx).await }
    };
    let code =
        |result: Result<toolkey::ToolOutput, ToolError>| result.unwrap_err().code().to_string();

    // Executed, replayed, conflict.
    assert!(
        !call("send_invoice", invoice("acme-secret-7781", 7781))
            .await
            .unwrap()
            .replayed
    );
    assert!(
        call("send_invoice", invoice("acme-secret-7781", 7781))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(
        code(call("send_invoice", invoice("acme-secret-7781", 1)).await),
        "CONFLICT"
    );
    // A terminal error, recorded and replayed.
    assert_eq!(
        code(call("send_invoice", invoice("blocked-secret-9093", 5)).await),
        "PAYMENT_DECLINED"
    );
    assert_eq!(
        code(call("send_invoice", invoice("blocked-secret-9093", 5)).await),
        "PAYMENT_DECLINED"
    );
    // The status companion.
    let status = call("invoice_status", invoice("acme-secret-7781", 7781))
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    let no_customer = json!({"period": "period-secret-0042"});
    assert_eq!(
        code(call("invoice_status", no_customer).await),
        "INVALID_ARGUMENTS"
    );
    // The caller stops waiting; its retry meets the body still running; the body ends later.
    let late = json!({"customer": "acme-secret-7781"});
    assert_eq!(code(call("late_invoice", late.clone()).await), "TIMEOUT");
    assert_eq!(code(call("late_invoice", late).await), "IN_PROGRESS");
    assert!(toolbox.shutdown().await.is_clean());

    // A body that cannot tell, then its retry on the unknown record.
    let order = json!({"order": "order-secret-6120"});
    assert_eq!(
        code(call("unsure_refund", order.clone()).await),
        "OUTCOME_UNKNOWN"
    );
    assert_eq!(
        code(call("unsure_refund", order.clone()).await),
        "OUTCOME_UNKNOWN"
    );

    // Steps: the first send fails retryably; the retry replays the draft and sends; a third call
    // replays the whole call.
    ledger.send_fails_once.store(true, Ordering::SeqCst);
    assert_eq!(
        code(call("confirm_order", order.clone()).await),
        "MAIL_DOWN"
    );
    assert!(!call("confirm_order", order.clone()).await.unwrap().replayed);
    assert!(call("confirm_order", order).await.unwrap().replayed);

    // The other stories, two of them through provider adapters with the provider's call ids.
    let answer = openai::handle_tool_call(
        toolbox,
        &json!({"id": "call_7Yc2", "type": "function", "function": {
            "name": "peek_balance", "arguments": "{\"customer\": \"acme-secret-7781\"}"}}),
        &ctx,
    )
    .await;
    assert_eq!(answer["tool_call_id"], "call_7Yc2");
    assert_eq!(
        code(call("peek_balance", json!({"customer": 7781})).await),
        "INVALID_ARGUMENTS"
    );
    let answer = anthropic::handle_tool_use(
        toolbox,
        &json!({"type": "tool_use", "id": "toolu_01Ab", "name": "set_paperless",
                "input": {"customer": "acme-secret-7781"}}),
        &ctx,
    )
    .await;
    assert_eq!(answer["is_error"], false);
    call("wire", json!({"account": "acme-secret-7781"}))
        .await
        .unwrap();
    assert_eq!(
        code(call("wire", json!({"account": "blocked-secret-9093"})).await),
        "APPROVAL_REQUIRED"
    );
}

/// The effects of [`every_outcome`], counted on the ledger.
fn assert_effects(ledger: &Ledger) {
    assert_eq!(
        ledger.invoices.lock().unwrap().len(),
        2,
        "send_invoice once, late_invoice once"
    );
    assert_eq!(ledger.refunds_tried.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.drafts.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.sends.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.flags.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.wires.load(Ordering::SeqCst), 1);
}

fn field<'a>(span: &'a SpanSeen, name: &str) -> Option<&'a str> {
    span.fields.get(name).map(String::as_str)
}

#[test]
fn each_call_is_one_span_that_says_what_happened_and_no_argument() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = toolbox(&ledger, false);
    let seen = observed(&DebuggingRecorder::new(), || {
        every_outcome(&toolbox, &ledger)
    });
    assert_effects(&ledger);

    let spans = seen.spans.lock().unwrap().clone();
    // Where each call's span is among all spans, in the order the calls were made.
    let call_at: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].name == CALL_SPAN)
        .collect();
    let calls: Vec<&SpanSeen> = call_at.iter().map(|&i| &spans[i]).collect();
    let summary: Vec<(&str, &str, &str, Option<&str>)> = calls
        .iter()
        .map(|s| {
            (
                field(s, "gen_ai.tool.name").unwrap(),
                field(s, "toolkey.story").unwrap(),
                field(s, "toolkey.outcome").unwrap_or("<none>"),
                field(s, "error.type"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("send_invoice", "idempotent", "executed", None),
            ("send_invoice", "idempotent", "replayed", None),
            ("send_invoice", "idempotent", "conflict", Some("CONFLICT")),
            (
                "send_invoice",
                "idempotent",
                "PAYMENT_DECLINED",
                Some("PAYMENT_DECLINED")
            ),
            (
                "send_invoice",
                "idempotent",
                "replayed",
                Some("PAYMENT_DECLINED")
            ),
            ("invoice_status", "read_only", "executed", None),
            (
                "invoice_status",
                "read_only",
                "INVALID_ARGUMENTS",
                Some("INVALID_ARGUMENTS"),
            ),
            ("late_invoice", "idempotent", "timeout", Some("TIMEOUT")),
            (
                "late_invoice",
                "idempotent",
                "in_progress",
                Some("IN_PROGRESS")
            ),
            (
                "unsure_refund",
                "idempotent",
                "unknown",
                Some("OUTCOME_UNKNOWN")
            ),
            (
                "unsure_refund",
                "idempotent",
                "unknown",
                Some("OUTCOME_UNKNOWN")
            ),
            (
                "confirm_order",
                "idempotent",
                "MAIL_DOWN",
                Some("MAIL_DOWN")
            ),
            ("confirm_order", "idempotent", "executed", None),
            ("confirm_order", "idempotent", "replayed", None),
            ("peek_balance", "read_only", "executed", None),
            (
                "peek_balance",
                "read_only",
                "INVALID_ARGUMENTS",
                Some("INVALID_ARGUMENTS")
            ),
            ("set_paperless", "natural", "executed", None),
            ("wire", "unkeyed", "executed", None),
            (
                "wire",
                "unkeyed",
                "APPROVAL_REQUIRED",
                Some("APPROVAL_REQUIRED")
            ),
        ]
    );

    // OpenTelemetry's GenAI fields on every call; an error's status on each error.
    for span in &calls {
        let tool = field(span, "gen_ai.tool.name").unwrap();
        assert_eq!(field(span, "gen_ai.operation.name"), Some("execute_tool"));
        assert_eq!(field(span, "gen_ai.tool.type"), Some("function"));
        assert_eq!(
            field(span, "otel.name").unwrap(),
            format!("execute_tool {tool}")
        );
        let error = field(span, "error.type").is_some();
        assert_eq!(
            field(span, "otel.status_code"),
            error.then_some("error"),
            "{span:?}"
        );
        assert_eq!(
            field(span, "toolkey.tenant"),
            None,
            "the tenant is off by default"
        );
        assert!(field(span, "toolkey.store_ops").is_some(), "{span:?}");
    }
    // The call ids the providers gave, on those calls only.
    let ids: Vec<(&str, &str)> = calls
        .iter()
        .filter_map(|s| {
            Some((
                field(s, "gen_ai.tool.name")?,
                field(s, "gen_ai.tool.call.id")?,
            ))
        })
        .collect();
    assert_eq!(
        ids,
        vec![
            ("peek_balance", "call_7Yc2"),
            ("set_paperless", "toolu_01Ab")
        ]
    );

    // The key's short hash names one action: the same on its calls and its status companion's,
    // another for another key, none for tools without a key.
    let hash = |i: usize| field(calls[i], "toolkey.key_hash");
    let first = hash(0).unwrap();
    assert_eq!(first.len(), 16);
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(
        (hash(1), hash(2), hash(5)),
        (Some(first), Some(first), Some(first))
    );
    assert_ne!(hash(3), Some(first));
    assert_eq!(
        (hash(6), hash(14), hash(16), hash(17)),
        (None, None, None, None)
    );

    // What the keyed calls waited on in the store: reserve (which reads the retry limit's count
    // too) and complete; nothing for a replay, read from the memory store's record in the
    // caller's task; the status companion's read.
    let store_ops = |i: usize| field(calls[i], "toolkey.store_ops").unwrap();
    assert_eq!(
        (store_ops(0), store_ops(1), store_ops(5), store_ops(14)),
        ("2", "0", "1", "0")
    );
    // The late call's lease (60 ms) was renewed while its body ran on (200 ms).
    let renewals: u32 = field(calls[7], "toolkey.lease_renewals")
        .unwrap()
        .parse()
        .unwrap();
    assert!(renewals >= 2, "{renewals}");

    // The late body's end is an event in its call's span.
    let events = seen.events.lock().unwrap().clone();
    let late: Vec<&EventSeen> = events
        .iter()
        .filter(|e| e.fields.contains_key("toolkey.late_outcome"))
        .collect();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].fields["toolkey.late_outcome"], "executed");
    assert_eq!(late[0].span, Some(call_at[7]));

    // Steps are child spans of their call: the draft, then on the retry the draft replayed and
    // the send; the third call replays the whole call and runs no step.
    let steps: Vec<(usize, &str, &str)> = spans
        .iter()
        .filter(|s| s.name == STEP_SPAN)
        .map(|s| {
            let parent = s.parent.expect("a step has its call as parent");
            assert_eq!(spans[parent].name, CALL_SPAN);
            (
                parent,
                field(s, "toolkey.step").unwrap(),
                field(s, "toolkey.outcome").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            (call_at[11], "draft", "executed"),
            (call_at[12], "draft", "replayed"),
            (call_at[12], "send", "executed"),
        ]
    );

    // No argument, result, message, key text, run id or tenant in any span or event.
    let everything = spans
        .iter()
        .flat_map(|s| s.fields.iter())
        .chain(events.iter().flat_map(|e| e.fields.iter()));
    let mut looked = 0;
    for (name, value) in everything {
        looked += 1;
        for secret in SECRETS {
            assert!(!value.contains(secret), "{name} = {value} holds {secret}");
        }
        assert!(
            !value.contains("invoice:"),
            "{name} = {value} holds a key's text"
        );
    }
    assert!(looked > 200, "{looked}");
}

#[test]
fn the_tenant_is_on_a_span_only_when_the_toolbox_allows_it() {
    for allowed in [false, true] {
        let ledger = Arc::new(Ledger::default());
        let toolbox = toolbox(&ledger, allowed);
        let seen = observed(&DebuggingRecorder::new(), || async {
            toolbox
                .call("peek_balance", json!({"customer": "acme"}), &ctx())
                .await
                .unwrap();
            toolbox
                .call(
                    "send_invoice",
                    invoice("acme", 1),
                    &ToolContext::new("run-2"),
                )
                .await
                .unwrap();
        });
        let spans = seen.spans.lock().unwrap().clone();
        let tenants: Vec<Option<&str>> = spans.iter().map(|s| field(s, "toolkey.tenant")).collect();
        let expected = if allowed {
            vec![Some("tenant-secret-3301"), None]
        } else {
            vec![None, None]
        };
        assert_eq!(tenants, expected, "allowed: {allowed}");
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics.

/// The snapshot as (kind, name, labels) → value, labels sorted.
type Metrics = HashMap<(MetricKind, String, Vec<(String, String)>), DebugValue>;

fn metrics_of(snapshotter: &Snapshotter) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((kind, key.name().to_string(), labels), value)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

#[test]
fn metrics_count_calls_by_tool_and_outcome_and_time_the_store() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = toolbox(&ledger, false);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = observed(&recorder, || every_outcome(&toolbox, &ledger));
    assert_effects(&ledger);
    let metrics = metrics_of(&snapshotter);

    let calls: Vec<(String, String, u64)> = metrics
        .iter()
        .filter(|((kind, name, _), _)| *kind == MetricKind::Counter && name == CALLS)
        .map(|((_, _, labels), value)| {
            let label = |k: &str| labels.iter().find(|(key, _)| key == k).unwrap().1.clone();
            let DebugValue::Counter(n) = value else {
                panic!("{value:?}")
            };
            (label("tool"), label("outcome"), *n)
        })
        .collect();
    let expected: Vec<(String, String, u64)> = [
        ("confirm_order", "MAIL_DOWN", 1),
        ("confirm_order", "executed", 1),
        ("confirm_order", "replayed", 1),
        ("invoice_status", "INVALID_ARGUMENTS", 1),
        ("invoice_status", "executed", 1),
        ("late_invoice", "in_progress", 1),
        ("late_invoice", "timeout", 1),
        ("peek_balance", "INVALID_ARGUMENTS", 1),
        ("peek_balance", "executed", 1),
        ("send_invoice", "PAYMENT_DECLINED", 1),
        ("send_invoice", "conflict", 1),
        ("send_invoice", "executed", 1),
        ("send_invoice", "replayed", 2),
        ("set_paperless", "executed", 1),
        ("unsure_refund", "unknown", 2),
        ("wire", "APPROVAL_REQUIRED", 1),
        ("wire", "executed", 1),
    ]
    .into_iter()
    .map(|(t, o, n)| (t.to_string(), o.to_string(), n))
    .collect();
    let mut sorted = calls.clone();
    sorted.sort();
    assert_eq!(sorted, expected);

    // Each call's latency, under the same labels as its count.
    for (tool, outcome, n) in &calls {
        let key = (
            MetricKind::Histogram,
            CALL_DURATION.to_string(),
            labels(&[("tool", tool), ("outcome", outcome)]),
        );
        let DebugValue::Histogram(samples) = &metrics[&key] else {
            panic!()
        };
        assert_eq!(samples.len() as u64, *n, "{tool} {outcome}");
        // The timed-out call is timed as its caller waited: 50 ms, not the body's 200 ms.
        if outcome == "timeout" {
            let waited = samples[0].into_inner();
            assert!((0.05..0.2).contains(&waited), "{waited}");
        }
    }

    // Store operations, counted exactly: two send_invoice reserves (its replays and conflict
    // are read from the memory store without one), two late_invoice, two unsure_refund, two
    // confirm_order (the third is a replay) and its three step reserves; the completes of
    // send_invoice (a result, a declined card), late_invoice, both confirm_order steps and its
    // second call; one unknown mark, one release (the failed send), one status read. The retry
    // limit (on by default) reads the failure count of each call that reserved its key with
    // its reserve (no `failures` operation of its own), counts the failed send and notes beside
    // the count that its draft step had finished, and clears both when the retry succeeds.
    let store = |op: &str| {
        let key = (
            MetricKind::Histogram,
            STORE_DURATION.to_string(),
            labels(&[("operation", op)]),
        );
        match metrics.get(&key) {
            Some(DebugValue::Histogram(samples)) => samples.len(),
            Some(other) => panic!("{other:?}"),
            None => 0,
        }
    };
    assert_eq!(
        [
            "reserve",
            "complete",
            "mark_unknown",
            "release",
            "get",
            "take_over",
            "failures",
            "count_failure",
            "clear_failures",
        ]
        .map(store),
        [11, 6, 1, 1, 1, 0, 0, 2, 2]
    );
    // Renewals happened beside the late body, as many as its span counted.
    let spans = seen.spans.lock().unwrap().clone();
    let renewals: usize = spans
        .iter()
        .filter_map(|s| field(s, "toolkey.lease_renewals")?.parse::<usize>().ok())
        .sum();
    assert!(renewals >= 2);
    assert_eq!(store("renew"), renewals);

    // Every body that started has ended.
    for tool in [
        "send_invoice",
        "late_invoice",
        "unsure_refund",
        "confirm_order",
        "peek_balance",
        "set_paperless",
        "wire",
    ] {
        let key = (
            MetricKind::Gauge,
            BODIES_IN_FLIGHT.to_string(),
            labels(&[("tool", tool)]),
        );
        let DebugValue::Gauge(value) = &metrics[&key] else {
            panic!()
        };
        assert_eq!(value.into_inner(), 0.0, "{tool}");
    }

    // Stats count the same calls as before.
    let stats = toolbox.stats();
    let mut expected = Stats::default();
    (expected.executed, expected.replayed, expected.conflicts) = (9, 3, 1);
    (
        expected.in_progress,
        expected.timeouts,
        expected.unknown,
        expected.released,
    ) = (1, 1, 2, 1);
    assert_eq!(stats, expected);
}

#[test]
fn a_body_is_in_flight_while_it_runs_after_its_caller_timed_out() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = toolbox(&ledger, false);
    let in_flight = Arc::new(Mutex::new(Vec::new()));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauge = |snapshotter: &Snapshotter| {
        let key = (
            MetricKind::Gauge,
            BODIES_IN_FLIGHT.to_string(),
            labels(&[("tool", "late_invoice")]),
        );
        match metrics_of(snapshotter).get(&key) {
            Some(DebugValue::Gauge(value)) => value.into_inner(),
            _ => -1.0,
        }
    };
    observed(&recorder, || async {
        let err = toolbox
            .call("late_invoice", json!({"customer": "acme"}), &ctx())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "TIMEOUT");
        in_flight.lock().unwrap().push(gauge(&snapshotter));
        assert!(toolbox.shutdown().await.is_clean());
        in_flight.lock().unwrap().push(gauge(&snapshotter));
    });
    // The debugging recorder hands over a gauge's change since the last snapshot: one body went
    // in flight, and the same one came out.
    assert_eq!(*in_flight.lock().unwrap(), vec![1.0, -1.0]);
    assert_eq!(ledger.invoices.lock().unwrap().len(), 1);
}

/// A `read_only` call without a timeout runs in its caller's task: a caller that drops it ends
/// its read, and the span and the metrics say `cancelled`; one left to end says `executed`.
#[test]
fn a_read_only_call_dropped_by_its_caller_is_cancelled() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = toolbox(&ledger, false);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = observed(&recorder, || async {
        let ctx = ctx();
        let call = toolbox.call("watch_balance", json!({"customer": "acme"}), &ctx);
        assert!(tokio::time::timeout(Duration::from_millis(20), call)
            .await
            .is_err());
        let call = toolbox.call("watch_balance", json!({"customer": "acme"}), &ctx);
        let (answer, ()) = tokio::join!(call, async {
            while ledger.watches.load(Ordering::SeqCst) < 2 {
                tokio::task::yield_now().await;
            }
            ledger.watch_ends.notify_waiters();
        });
        assert_eq!(answer.unwrap().value, json!("balance of acme: 1"));
    });
    assert_eq!(ledger.watches.load(Ordering::SeqCst), 2);
    assert_eq!(ledger.watched.load(Ordering::SeqCst), 1);
    let spans = seen.spans.lock().unwrap().clone();
    let outcomes: Vec<Option<&str>> = spans
        .iter()
        .filter(|s| s.name == CALL_SPAN)
        .map(|s| field(s, "toolkey.outcome"))
        .collect();
    assert_eq!(outcomes, vec![Some("cancelled"), Some("executed")]);
    let metrics = metrics_of(&snapshotter);
    for (outcome, n) in [("cancelled", 1), ("executed", 1)] {
        let key = (
            MetricKind::Counter,
            CALLS.to_string(),
            labels(&[("outcome", outcome), ("tool", "watch_balance")]),
        );
        assert!(
            matches!(metrics.get(&key), Some(DebugValue::Counter(c)) if *c == n),
            "{outcome}: {:?}",
            metrics.get(&key)
        );
    }
    // Both bodies left the in-flight gauge: the dropped one as its read was cancelled.
    let gauge = (
        MetricKind::Gauge,
        BODIES_IN_FLIGHT.to_string(),
        labels(&[("tool", "watch_balance")]),
    );
    assert!(
        matches!(metrics.get(&gauge), Some(DebugValue::Gauge(g)) if g.into_inner() == 0.0),
        "{:?}",
        metrics.get(&gauge)
    );
}

/// Over MCP a call has no tool call id; its span carries the `tools/call` request's id instead.
#[cfg(feature = "mcp")]
#[test]
fn an_mcp_call_carries_its_request_id() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    use toolkey::providers::mcp::McpServer;

    let ledger = Arc::new(Ledger::default());
    let toolbox = toolbox(&ledger, false);
    let seen = observed(&DebuggingRecorder::new(), || async {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = McpServer::new(toolbox.clone());
        tokio::spawn(async move {
            if let Ok(running) = server.serve(server_io).await {
                let _ = running.waiting().await;
            }
        });
        let client = ().serve(client_io).await.expect("the server initializes");
        for customer in ["acme-secret-7781", "acme"] {
            let arguments = json!({"customer": customer}).as_object().unwrap().clone();
            let params = CallToolRequestParams::new("peek_balance").with_arguments(arguments);
            let result = client.call_tool(params).await.unwrap();
            assert_eq!(result.is_error, Some(false));
        }
        client.cancel().await.unwrap();
    });
    let spans = seen.spans.lock().unwrap().clone();
    let calls: Vec<(Option<&str>, Option<&str>, Option<&str>)> = spans
        .iter()
        .filter(|s| s.name == CALL_SPAN)
        .map(|s| {
            (
                field(s, "jsonrpc.request.id"),
                field(s, "mcp.method.name"),
                field(s, "gen_ai.tool.call.id"),
            )
        })
        .collect();
    assert_eq!(calls.len(), 2);
    for (request_id, method, call_id) in &calls {
        assert!(request_id.is_some_and(|id| !id.is_empty()), "{calls:?}");
        assert_eq!((*method, *call_id), (Some("tools/call"), None));
    }
    assert_ne!(calls[0].0, calls[1].0, "each request has its own id");
    let everything = spans.iter().flat_map(|s| s.fields.values());
    assert!(everything.clone().all(|v| !v.contains("acme-secret-7781")));
}

/// A retry limit's refusal and a concurrency limit's are outcomes like any error: their codes.
#[test]
fn retry_limit_and_busy_answers_are_their_codes() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = Toolbox::builder()
        .shared_state(ledger.clone())
        .tool(Charge)
        .tool(ExportReport)
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = observed(&recorder, || async {
        let order = json!({"order": "order-secret-6120"});
        let mut codes = Vec::new();
        for _ in 0..3 {
            let answer = toolbox.call("charge", order.clone(), &ctx()).await;
            codes.push(answer.unwrap_err().code().to_string());
        }
        assert_eq!(codes, ["GATEWAY_DOWN", "RETRY_LIMIT", "RETRY_LIMIT"]);
        // The first export holds the only slot past its caller's timeout; the second gets none.
        let report = json!({"name": "q3"});
        for expected in ["TIMEOUT", "BUSY"] {
            let answer = toolbox.call("export_report", report.clone(), &ctx()).await;
            assert_eq!(answer.unwrap_err().code(), expected);
        }
        assert!(toolbox.shutdown().await.is_clean());
    });
    assert_eq!(ledger.charges_tried.load(Ordering::SeqCst), 2);
    assert_eq!(ledger.exports.load(Ordering::SeqCst), 1);

    let spans = seen.spans.lock().unwrap().clone();
    let outcomes: Vec<(&str, &str)> = spans
        .iter()
        .filter(|s| s.name == CALL_SPAN)
        .map(|s| {
            let outcome = field(s, "toolkey.outcome").unwrap();
            // Every one an error: its code, `TIMEOUT` for `timeout`.
            let code = field(s, "error.type").unwrap();
            assert_eq!(code, outcome.to_uppercase());
            (field(s, "gen_ai.tool.name").unwrap(), outcome)
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("charge", "GATEWAY_DOWN"),
            ("charge", "RETRY_LIMIT"),
            ("charge", "RETRY_LIMIT"),
            ("export_report", "timeout"),
            ("export_report", "BUSY"),
        ]
    );
    let metrics = metrics_of(&snapshotter);
    let count = |tool: &str, outcome: &str| {
        let key = (
            MetricKind::Counter,
            CALLS.to_string(),
            labels(&[("tool", tool), ("outcome", outcome)]),
        );
        match metrics.get(&key) {
            Some(DebugValue::Counter(n)) => *n,
            _ => 0,
        }
    };
    assert_eq!(
        [
            count("charge", "GATEWAY_DOWN"),
            count("charge", "RETRY_LIMIT"),
            count("export_report", "timeout"),
            count("export_report", "BUSY"),
        ],
        [1, 2, 1, 1]
    );
}

/// An operator's `resolve` is logged with the record's key by hash, and its tenant in clear only
/// when the toolbox lets spans name tenants; otherwise by hash too.
#[test]
fn an_operators_resolve_names_the_tenant_only_when_the_toolbox_allows_it() {
    for allowed in [false, true] {
        let ledger = Arc::new(Ledger::default());
        let toolbox = toolbox(&ledger, allowed);
        let seen = observed(&DebuggingRecorder::new(), || async {
            let order = json!({"order": "order-secret-6120"});
            let err = toolbox.call("unsure_refund", order, &ctx()).await;
            assert_eq!(err.unwrap_err().code(), "OUTCOME_UNKNOWN");
            let admin = toolbox.admin();
            let filter = toolkey::store::Filter {
                tenant: Some("tenant-secret-3301".into()),
                ..Default::default()
            };
            let entries = admin.list(&filter, 10).await.unwrap();
            assert_eq!(entries.len(), 1);
            let resolved = admin
                .resolve(
                    &entries[0].key,
                    &entries[0].revision,
                    &toolkey::store::Resolution::NotDone,
                )
                .await
                .unwrap();
            assert_eq!(resolved, toolkey::admin::Resolved::Applied);
        });
        let events = seen.events.lock().unwrap().clone();
        let resolved: Vec<&EventSeen> = events
            .iter()
            .filter(|e| {
                e.fields.get("message").map(String::as_str)
                    == Some("an operator resolved an unknown record")
            })
            .collect();
        assert_eq!(resolved.len(), 1, "allowed: {allowed}");
        let fields = &resolved[0].fields;
        assert_eq!(
            fields.get("tenant").map(String::as_str),
            allowed.then_some("tenant-secret-3301"),
        );
        assert_eq!(fields.contains_key("tenant_hash"), !allowed);
        assert!(!fields.values().any(|v| v.contains("order-secret-6120")));
        if !allowed {
            assert!(!fields.values().any(|v| v.contains("tenant-secret-3301")));
        }
    }
}
