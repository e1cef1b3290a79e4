//! Approvals bound to the exact call, on every store: a fake refund system counts what was
//! really done, and each scenario ends with an exact count.
//!
//! Approve → exactly one effect, and replays after; deny → none, and the retry refused; expire
//! → none; an approval of one amount never covers another; a call without a key uses its
//! approval up; decisions are fenced on the revision; tenants see nothing of each other.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolkey::admin::{Admin, DecisionRefused};
use toolkey::store::{ApprovalKey, ApprovalState, ApprovalStatus, ManualClock, MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::servers;

/// The outside system: every refund and wire it made.
#[derive(Default)]
struct Ledger {
    made: Mutex<Vec<(String, i64)>>,
}

impl Ledger {
    fn count(&self) -> usize {
        self.made.lock().unwrap().len()
    }

    fn make(&self, what: String, cents: i64) -> Value {
        let mut made = self.made.lock().unwrap();
        made.push((what, cents));
        json!({"id": made.len(), "cents": cents})
    }
}

/// Refund part of an order. Every refund waits for a person's approval.
#[tool(idempotent(key = "refund:<order>"), approval)]
async fn refund(
    ledger: State<Ledger>,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Value, ToolError> {
    Ok(ledger.make(format!("refund {order}"), cents))
}

/// Refund part of an order, whose record is kept for a second once it is done.
#[tool(idempotent(key = "refund:<order>"), approval, retain = "1s")]
async fn refund_briefly_kept(
    ledger: State<Ledger>,
    /// The order.
    order: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Value, ToolError> {
    Ok(ledger.make(format!("refund {order}"), cents))
}

/// Pay a supplier; the toolbox's rule sends payments above 100.00 to a person.
#[tool(idempotent(key = "payout:<invoice>"))]
async fn pay_out(
    ledger: State<Ledger>,
    /// The supplier's invoice.
    invoice: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Value, ToolError> {
    Ok(ledger.make(format!("payout {invoice}"), cents))
}

/// Wire money; no key: every approved call is one wire.
#[tool(unkeyed, approval)]
async fn wire(
    ledger: State<Ledger>,
    /// Where to.
    to: String,
    /// The amount in cents.
    cents: i64,
) -> Result<Value, ToolError> {
    Ok(ledger.make(format!("wire {to}"), cents))
}

/// Tip a courier; no business identity, so the key is the call's place in the run.
#[tool(
    idempotent(key = "tip:<ctx.run_id>:<ctx.step>", status = false),
    approval
)]
async fn tip(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    /// The amount in cents.
    cents: i64,
) -> Result<Value, ToolError> {
    let _ = ctx;
    Ok(ledger.make("tip".into(), cents))
}

type Pass = Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One store under test, and how time passes on it.
#[derive(Clone)]
struct Target {
    store: Arc<dyn Store>,
    pass: Pass,
    /// How long a request waits: short on a clock the test moves, long enough on a server's
    /// for a scenario's decisions to land before it (a listing walks the server's keyspace).
    expiry: Duration,
}

/// A toolbox over `target` with its ledger, the count of requests its hook heard of, and an
/// operator's face on the same store.
struct Setup {
    toolbox: Toolbox,
    ledger: Arc<Ledger>,
    heard: Arc<AtomicUsize>,
    admin: Admin,
    ctx: ToolContext,
    target: Target,
}

/// A request's expiry on a clock the test moves.
const EXPIRY: Duration = Duration::from_millis(400);

/// A request's expiry on a server's clock.
const SERVER_EXPIRY: Duration = Duration::from_secs(5);

fn setup(target: &Target) -> Setup {
    let ledger = Arc::new(Ledger::default());
    let heard = Arc::new(AtomicUsize::new(0));
    let hook = heard.clone();
    let toolbox = Toolbox::builder()
        .shared_store(target.store.clone())
        .shared_state(ledger.clone())
        .tool(Refund)
        .tool(PayOut)
        .tool(Wire)
        .tool(Tip)
        .tool(RefundBrieflyKept)
        .require_approval(|tool, args| {
            tool == "pay_out" && args["cents"].as_i64().is_some_and(|cents| cents > 10_000)
        })
        .on_approval_request(move |_| {
            hook.fetch_add(1, Ordering::SeqCst);
        })
        .approval_expiry(target.expiry)
        .build()
        .unwrap();
    let tenant = format!("approvals-{}", uuid::Uuid::new_v4().simple());
    Setup {
        admin: Admin::new(target.store.clone()),
        ctx: ToolContext::new("run-1").with_tenant(tenant),
        toolbox,
        ledger,
        heard,
        target: target.clone(),
    }
}

impl Setup {
    async fn call(&self, tool: &str, args: Value) -> Result<toolkey::ToolOutput, ToolError> {
        self.toolbox.call(tool, args, &self.ctx).await
    }

    fn tenant(&self) -> &str {
        self.ctx.tenant().unwrap()
    }

    fn id(&self, tool: &str, key: &str) -> ApprovalKey {
        ApprovalKey::new(self.tenant(), tool, key)
    }

    async fn pass(&self, d: Duration) {
        (self.target.pass)(d).await
    }
}

fn awaiting(answer: Result<toolkey::ToolOutput, ToolError>) -> ToolError {
    let err = answer.expect_err("the call waits for approval");
    assert!(err.is(ErrorCode::AwaitingApproval), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    err
}

async fn approve_runs_exactly_once(target: &Target) {
    let s = setup(target);
    let args = json!({"order": "o-1", "cents": 15_000});
    awaiting(s.call("refund", args.clone()).await);
    // Asked again before anyone decided: still waiting, and the hook is not told twice.
    awaiting(s.call("refund", args.clone()).await);
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (0, 1));
    let status = s.call("refund_status", args.clone()).await.unwrap();
    assert_eq!(
        status.value["status"], "awaiting_approval",
        "{}",
        status.value
    );
    let pending = s.admin.pending(s.tenant(), 10).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let request = &pending[0];
    assert_eq!(
        (
            request.id.tool.as_str(),
            request.id.key.as_str(),
            request.revision
        ),
        ("refund", "refund:o-1", 1)
    );
    assert_eq!(request.arguments, args);
    assert_eq!(request.requested_by.run_id, "run-1");
    let decided = s
        .admin
        .approve(
            &request.id,
            request.revision,
            "ops@example.com",
            Some("customer called"),
        )
        .await
        .unwrap();
    let decision = decided.decision.as_ref().unwrap();
    assert!(
        decision.approved && decision.by == "ops@example.com",
        "{decided:?}"
    );
    assert_eq!(s.ledger.count(), 0, "approving runs nothing by itself");
    let ran = s.call("refund", args.clone()).await.unwrap();
    assert!(!ran.replayed);
    let again = s.call("refund", args.clone()).await.unwrap();
    assert!(again.replayed && again.value == ran.value, "{again:?}");
    assert_eq!(s.ledger.count(), 1);
    assert!(s.admin.pending(s.tenant(), 10).await.unwrap().is_empty());
}

async fn an_approval_covers_one_run_of_its_key(target: &Target) {
    let s = setup(target);
    let args = json!({"order": "o-9", "cents": 900});
    awaiting(s.call("refund_briefly_kept", args.clone()).await);
    let id = s.id("refund_briefly_kept", "refund:o-9");
    s.admin
        .approve(&id, 1, "ops@example.com", None)
        .await
        .unwrap();
    assert!(
        !s.call("refund_briefly_kept", args.clone())
            .await
            .unwrap()
            .replayed
    );
    assert!(
        s.call("refund_briefly_kept", args.clone())
            .await
            .unwrap()
            .replayed
    );
    // The key's record is gone: the same arguments are new work, and the approval of the run
    // that is over does not cover it.
    s.pass(Duration::from_millis(2_500)).await;
    awaiting(s.call("refund_briefly_kept", args.clone()).await);
    assert_eq!(s.ledger.count(), 1);
    let pending = s.admin.pending(s.tenant(), 10).await.unwrap();
    assert_eq!(
        pending.iter().map(|r| r.revision).collect::<Vec<_>>(),
        vec![2],
        "{pending:?}"
    );
}

async fn deny_is_final(target: &Target) {
    let s = setup(target);
    let args = json!({"order": "o-2", "cents": 500});
    awaiting(s.call("refund", args.clone()).await);
    let id = s.id("refund", "refund:o-2");
    s.admin.deny(&id, 1, "ops@example.com", None).await.unwrap();
    for _ in 0..2 {
        let err = s.call("refund", args.clone()).await.unwrap_err();
        assert!(
            err.is(ErrorCode::ApprovalDenied) && !err.is_retryable(),
            "{err:?}"
        );
    }
    let status = s.call("refund_status", args.clone()).await.unwrap();
    assert_eq!(
        status.value["status"], "approval_denied",
        "{}",
        status.value
    );
    // A second decision on the same request is refused, naming the first.
    match s.admin.approve(&id, 1, "someone-else", None).await {
        Err(DecisionRefused::Decided {
            status, decision, ..
        }) => {
            assert_eq!(status, ApprovalStatus::Denied);
            assert_eq!(decision.unwrap().by, "ops@example.com");
        }
        other => panic!("a second decision was not refused: {other:?}"),
    }
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (0, 1));
}

async fn an_expired_request_never_runs(target: &Target) {
    let s = setup(target);
    let args = json!({"order": "o-3", "cents": 700});
    awaiting(s.call("refund", args.clone()).await);
    s.pass(target.expiry + target.expiry / 5).await;
    let id = s.id("refund", "refund:o-3");
    match s.admin.approve(&id, 1, "ops@example.com", None).await {
        Err(DecisionRefused::Expired { revision: 1 }) => {}
        other => panic!("an expired request was decided: {other:?}"),
    }
    assert!(s.admin.pending(s.tenant(), 10).await.unwrap().is_empty());
    // The next call opens a new request; the expired one stays readable.
    awaiting(s.call("refund", args.clone()).await);
    let latest = s.admin.approval(&id).await.unwrap().unwrap();
    assert_eq!((latest.revision, latest.state), (2, ApprovalState::Pending));
    let all = s.admin.approvals(s.tenant(), None, 10).await.unwrap();
    assert_eq!(all.iter().map(|r| r.revision).collect::<Vec<_>>(), [1, 2]);
    // A page that still shows revision 1 cannot decide revision 2.
    match s.admin.approve(&id, 1, "ops@example.com", None).await {
        Err(DecisionRefused::Stale {
            seen: 1, latest: 2, ..
        }) => {}
        other => panic!("a stale revision was decided: {other:?}"),
    }
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (0, 2));
}

async fn an_approval_never_covers_other_arguments(target: &Target) {
    let s = setup(target);
    let asked = json!({"order": "o-4", "cents": 2_000});
    let other = json!({"order": "o-4", "cents": 200_000});
    awaiting(s.call("refund", asked.clone()).await);
    let id = s.id("refund", "refund:o-4");
    s.admin
        .approve(&id, 1, "ops@example.com", None)
        .await
        .unwrap();
    let err = s.call("refund", other.clone()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!(s.ledger.count(), 0);
    let status = s.call("refund_status", other.clone()).await.unwrap();
    assert_eq!(status.value["status"], "conflict", "{}", status.value);
    s.call("refund", asked.clone()).await.unwrap();
    let err = s.call("refund", other).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!(
        *s.ledger.made.lock().unwrap(),
        [("refund o-4".into(), 2_000)]
    );
}

async fn a_call_without_a_key_uses_its_approval_up(target: &Target) {
    let s = setup(target);
    let asked = json!({"to": "acme", "cents": 1_000});
    let other = json!({"to": "acme", "cents": 900_000});
    awaiting(s.call("wire", asked.clone()).await);
    let pending = s.admin.pending(s.tenant(), 10).await.unwrap();
    let id = pending[0].id.clone();
    s.admin
        .approve(&id, 1, "ops@example.com", None)
        .await
        .unwrap();
    // Other arguments are another request, never this one.
    awaiting(s.call("wire", other).await);
    assert_eq!(s.ledger.count(), 0);
    s.call("wire", asked.clone()).await.unwrap();
    // Used up: the same arguments again wait for a new decision.
    awaiting(s.call("wire", asked.clone()).await);
    let latest = s.admin.approval(&id).await.unwrap().unwrap();
    assert_eq!((latest.revision, latest.state), (2, ApprovalState::Pending));
    let used = s
        .admin
        .approvals(s.tenant(), Some(ApprovalState::Used), 10)
        .await
        .unwrap();
    assert_eq!(used.len(), 1, "{used:?}");
    assert!(used[0].used_at.is_some());
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (1, 3));
}

async fn a_rule_sends_only_the_calls_it_names(target: &Target) {
    let s = setup(target);
    s.call("pay_out", json!({"invoice": "i-1", "cents": 9_000}))
        .await
        .unwrap();
    awaiting(
        s.call("pay_out", json!({"invoice": "i-2", "cents": 12_000}))
            .await,
    );
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (1, 1));
}

async fn racing_calls_open_one_request_and_run_once(target: &Target) {
    let s = Arc::new(setup(target));
    let args = json!({"order": "o-5", "cents": 300});
    let race = |s: Arc<Setup>| {
        let args = args.clone();
        tokio::spawn(async move { s.call("refund", args).await })
    };
    let calls: Vec<_> = (0..16).map(|_| race(s.clone())).collect();
    for call in calls {
        awaiting(call.await.unwrap());
    }
    assert_eq!(
        s.heard.load(Ordering::SeqCst),
        1,
        "16 racing calls open one request"
    );
    let id = s.id("refund", "refund:o-5");
    s.admin
        .approve(&id, 1, "ops@example.com", None)
        .await
        .unwrap();
    let calls: Vec<_> = (0..16).map(|_| race(s.clone())).collect();
    let mut ran = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(out) if !out.replayed => ran += 1,
            Ok(_) => {}
            Err(err) => assert!(err.is(ErrorCode::InProgress), "{err:?}"),
        }
    }
    assert_eq!((ran, s.ledger.count()), (1, 1));
}

async fn tenants_see_nothing_of_each_other(target: &Target) {
    let s = setup(target);
    awaiting(
        s.call("refund", json!({"order": "o-6", "cents": 100}))
            .await,
    );
    let other = format!("{}-other", s.tenant());
    assert!(s.admin.pending(&other, 10).await.unwrap().is_empty());
    let theirs = ApprovalKey::new(other, "refund", "refund:o-6");
    match s.admin.approve(&theirs, 1, "intruder", None).await {
        Err(DecisionRefused::NotFound { revision: 1 }) => {}
        other => panic!("another tenant decided this tenant's request: {other:?}"),
    }
    assert_eq!(s.admin.pending(s.tenant(), 10).await.unwrap().len(), 1);
    assert_eq!(s.ledger.count(), 0);
}

async fn a_call_keyed_on_its_step_uses_its_approval_up(target: &Target) {
    let s = setup(target);
    let args = json!({"cents": 300});
    let call = |step| {
        let (toolbox, args) = (s.toolbox.clone(), args.clone());
        let ctx = s.ctx.clone().with_step(step);
        async move { toolbox.call("tip", args, &ctx).await }
    };
    awaiting(call(1).await);
    let pending = s.admin.pending(s.tenant(), 10).await.unwrap();
    s.admin
        .approve(&pending[0].id, 1, "ops@example.com", None)
        .await
        .unwrap();
    // The model's call after the decision has a step of its own: it runs, once.
    assert!(!call(2).await.unwrap().replayed);
    // That step again is its record's replay, not a new approval.
    assert!(call(2).await.unwrap().replayed);
    // A later step is a new action: it waits for a new decision.
    awaiting(call(3).await);
    assert_eq!((s.ledger.count(), s.heard.load(Ordering::SeqCst)), (1, 2));
}

async fn every_scenario(target: Target) {
    a_call_keyed_on_its_step_uses_its_approval_up(&target).await;
    approve_runs_exactly_once(&target).await;
    an_approval_covers_one_run_of_its_key(&target).await;
    deny_is_final(&target).await;
    an_expired_request_never_runs(&target).await;
    an_approval_never_covers_other_arguments(&target).await;
    a_call_without_a_key_uses_its_approval_up(&target).await;
    a_rule_sends_only_the_calls_it_names(&target).await;
    racing_calls_open_one_request_and_run_once(&target).await;
    tenants_see_nothing_of_each_other(&target).await;
}

#[tokio::test]
async fn a_hook_that_panics_costs_the_call_nothing() {
    let ledger = Arc::new(Ledger::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(ledger.clone())
        .tool(Refund)
        .on_approval_request(|_| panic!("the pager is down"))
        .build()
        .unwrap();
    let ctx = ToolContext::new("run-1").with_tenant("acme");
    let args = json!({"order": "o-9", "cents": 100});
    awaiting(toolbox.call("refund", args.clone(), &ctx).await);
    let admin = Admin::new(store);
    assert_eq!(admin.pending("acme", 10).await.unwrap().len(), 1);
    awaiting(toolbox.call("refund", args, &ctx).await);
    assert_eq!(ledger.count(), 0);
}

fn sleeping() -> Pass {
    Arc::new(|d| Box::pin(tokio::time::sleep(d)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_memory_store() {
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let pass: Pass = Arc::new(move |d| {
        clock.advance(d);
        Box::pin(async {})
    });
    every_scenario(Target {
        store,
        pass,
        expiry: EXPIRY,
    })
    .await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let store = toolkey::store::SqliteStore::open(dir.path().join("approvals.db"))
        .unwrap()
        .with_clock(clock.clone());
    let pass: Pass = Arc::new(move |d| {
        clock.advance(d);
        Box::pin(async {})
    });
    every_scenario(Target {
        store: Arc::new(store),
        pass,
        expiry: EXPIRY,
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_postgres_store() {
    const VAR: &str = "TOOLKEY_POSTGRES_URL";
    let url = servers::url(VAR, "postgres://postgres@127.0.0.1:5432/test");
    let store = match toolkey::store::PostgresStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => return servers::unreachable("PostgreSQL", VAR, &url, e),
    };
    every_scenario(Target {
        store: Arc::new(store),
        pass: sleeping(),
        expiry: SERVER_EXPIRY,
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_redis_store() {
    const VAR: &str = "TOOLKEY_REDIS_URL";
    let url = servers::url(VAR, "redis://127.0.0.1:6379");
    let store = match toolkey::store::RedisStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => return servers::unreachable("Redis", VAR, &url, e),
    };
    every_scenario(Target {
        store: Arc::new(store),
        pass: sleeping(),
        expiry: SERVER_EXPIRY,
    })
    .await;
}

/// Runs the `toolkey` command with `args` after `--store url`.
async fn toolkey(url: &str, args: &[&str]) -> (toolkey_cli::Exit, String) {
    let mut line = vec!["toolkey", "--store", url];
    line.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = toolkey_cli::run(line, &mut out, &mut err).await;
    let (out, err) = (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    );
    assert!(err.is_empty(), "{err}");
    (exit, out)
}

/// A person decides from the command line: lists what waits, approves with the revision shown,
/// is refused a second decision and a revision that does not exist, denies another request.
async fn decided_from_the_command_line(url: &str, store: Arc<dyn Store>) {
    use toolkey_cli::Exit;
    let pass = sleeping();
    let s = setup(&Target {
        store,
        pass,
        expiry: SERVER_EXPIRY,
    });
    let toolbox = Toolbox::builder()
        .shared_store(s.target.store.clone())
        .shared_state(s.ledger.clone())
        .tool(Refund)
        .build()
        .unwrap();
    let call = |args: Value| {
        let (toolbox, ctx) = (toolbox.clone(), s.ctx.clone());
        async move { toolbox.call("refund", args, &ctx).await }
    };
    let tenant = s.tenant().to_owned();
    awaiting(call(json!({"order": "o-7", "cents": 100})).await);
    awaiting(call(json!({"order": "o-8", "cents": 200})).await);
    let (exit, out) = toolkey(url, &["--json", "approvals", "list", "--tenant", &tenant]).await;
    assert_eq!(exit, Exit::Done, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["refund:o-7", "refund:o-8"], "{listed}");
    assert_eq!(listed[0]["status"], "pending");
    assert_eq!(listed[0]["revision"], 1);
    let request = [
        "--tenant",
        &tenant,
        "--tool",
        "refund",
        "--key",
        "refund:o-7",
    ];
    let decide = |verb: &'static str, revision: &'static str| {
        let mut line = vec!["approvals", verb];
        line.extend_from_slice(&request);
        line.extend_from_slice(&["--revision", revision, "--by", "ops@example.com"]);
        line
    };
    let (exit, out) = toolkey(url, &decide("approve", "2")).await;
    assert_eq!(exit, Exit::NotFound, "{out}");
    let (exit, out) = toolkey(url, &decide("approve", "1")).await;
    assert_eq!(exit, Exit::Done, "{out}");
    assert!(out.contains("approved request 1"), "{out}");
    let (exit, out) = toolkey(url, &decide("deny", "1")).await;
    assert_eq!(exit, Exit::Refused, "{out}");
    assert!(out.contains("already decided"), "{out}");
    let mut show = vec!["--json", "approvals", "show"];
    show.extend_from_slice(&request);
    let (exit, out) = toolkey(url, &show).await;
    assert_eq!(exit, Exit::Done, "{out}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["status"], "approved", "{shown}");
    assert_eq!(shown["decision"]["by"], "ops@example.com", "{shown}");
    call(json!({"order": "o-7", "cents": 100})).await.unwrap();
    let other = [
        "--tenant",
        &tenant,
        "--tool",
        "refund",
        "--key",
        "refund:o-8",
    ];
    let mut deny = vec!["approvals", "deny"];
    deny.extend_from_slice(&other);
    deny.extend_from_slice(&[
        "--revision",
        "1",
        "--by",
        "ops@example.com",
        "--reason",
        "duplicate",
    ]);
    let (exit, out) = toolkey(url, &deny).await;
    assert_eq!(exit, Exit::Done, "{out}");
    let err = call(json!({"order": "o-8", "cents": 200}))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::ApprovalDenied), "{err:?}");
    let (exit, out) = toolkey(url, &["--json", "approvals", "list", "--tenant", &tenant]).await;
    assert_eq!((exit, out.trim()), (Exit::Done, "[]"));
    assert_eq!(*s.ledger.made.lock().unwrap(), [("refund o-7".into(), 100)]);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_decides_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cli.db");
    let store = toolkey::store::SqliteStore::open(&path).unwrap();
    let url = format!("sqlite:{}", path.display());
    decided_from_the_command_line(&url, Arc::new(store)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_decides_on_postgres() {
    const VAR: &str = "TOOLKEY_POSTGRES_URL";
    let url = servers::url(VAR, "postgres://postgres@127.0.0.1:5432/test");
    let store = match toolkey::store::PostgresStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => return servers::unreachable("PostgreSQL", VAR, &url, e),
    };
    decided_from_the_command_line(&url, Arc::new(store)).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_decides_on_redis() {
    const VAR: &str = "TOOLKEY_REDIS_URL";
    let url = servers::url(VAR, "redis://127.0.0.1:6379");
    let store = match toolkey::store::RedisStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => return servers::unreachable("Redis", VAR, &url, e),
    };
    decided_from_the_command_line(&url, Arc::new(store)).await;
}
