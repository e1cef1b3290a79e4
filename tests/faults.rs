//! One test per fault the simulation found on the first executor, each counting effects on a
//! ledger: a body that blocks its thread past its lease, an outcome whose first write fails, a
//! reserve whose reply is lost, and a call whose lease was taken over.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
use toolkey::store::{ManualClock, MemoryStore, Store};
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

/// The outside system: picks made per order, and what a lookup finds.
#[derive(Default)]
struct Warehouse {
    picks: Mutex<Vec<String>>,
    /// How long a pick blocks its thread (a synchronous client).
    block: Mutex<Duration>,
    /// Set to hold a pick until the test releases it.
    gate: Mutex<Option<Arc<tokio::sync::Notify>>>,
    /// Set to make the next slow pick report that it cannot tell whether it picked.
    unsure_once: std::sync::atomic::AtomicBool,
    /// How long a late-blocking pick waits on a timer before it blocks (20 ms unless set).
    late: Mutex<Option<Duration>>,
}

impl Warehouse {
    fn picks(&self) -> usize {
        self.picks.lock().unwrap().len()
    }

    async fn pick(&self, order: &str) -> String {
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.notified().await;
        }
        let block = *self.block.lock().unwrap();
        if !block.is_zero() {
            std::thread::sleep(block);
        }
        let mut picks = self.picks.lock().unwrap();
        picks.push(order.to_string());
        format!("pick-{}", picks.len())
    }

    fn find(&self, order: &str) -> Option<String> {
        let picks = self.picks.lock().unwrap();
        picks
            .iter()
            .position(|o| o == order)
            .map(|i| format!("pick-{}", i + 1))
    }
}

/// Pick an order, looked up before a retry acts.
#[tool(idempotent(key = "pick:<order>", recover = find_pick), lease = "300ms", timeout = "100ms")]
async fn pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    Ok(warehouse.pick(&order).await)
}

async fn find_pick(
    warehouse: State<Warehouse>,
    order: String,
) -> Result<Option<String>, ToolError> {
    Ok(warehouse.find(&order))
}

/// Pick an order, with no way to look it up.
#[tool(idempotent(key = "blind-pick:<order>"))]
async fn blind_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    Ok(warehouse.pick(&order).await)
}

/// Pick an order after three seconds of work; a retry looks it up first.
#[tool(idempotent(key = "slow-pick:<order>", recover = find_pick), lease = "300ms")]
async fn slow_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    if warehouse
        .unsure_once
        .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        return Err(ToolError::outcome_unknown("the scanner did not answer"));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(warehouse.pick(&order).await)
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

fn toolbox(store: impl Store, warehouse: Arc<Warehouse>) -> Toolbox {
    Toolbox::builder()
        .store(store)
        .shared_state(warehouse)
        .tool(Pick)
        .tool(BlindPick)
        .tool(SlowPick)
        .shutdown_grace(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A body that blocks its thread for three leases keeps its key: the lease is renewed by the
/// runtime's renewer task, which another worker runs, so a retry with a recover hook finds the
/// call in progress instead of taking the key over and picking a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_blocks_its_thread_keeps_its_lease() {
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = toolbox(MemoryStore::new(), warehouse.clone());
    held_pick_keeps_its_lease(&toolbox, &warehouse, "o-1", Hold::Block).await;
}

/// The same under a concurrency limit, where the lease is first registered while the call waits
/// for its slot (the renewer woken then), and registered again for the body: the renewer must
/// not be left waiting in the slot of the worker the body then blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_blocks_its_thread_under_a_concurrency_limit_keeps_its_lease() {
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = limited_toolbox(&warehouse);
    held_pick_keeps_its_lease(&toolbox, &warehouse, "o-1", Hold::Block).await;
}

/// A toolbox of `pick` on a memory store, one pick at a time.
fn limited_toolbox(warehouse: &Arc<Warehouse>) -> Toolbox {
    Toolbox::builder()
        .store(MemoryStore::new())
        .shared_state(warehouse.clone())
        .tool(Pick)
        .concurrency("pick", std::num::NonZeroUsize::new(1))
        .shutdown_grace(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Each runtime's leases are renewed by a renewer on that runtime: not by the renewer of a
/// runtime that is idle (a current-thread runtime nothing drives runs no task), nor by one of a
/// runtime that is gone. One toolbox runs on three runtimes in turn; each pick, waiting past its
/// lease, keeps it.
#[test]
fn each_runtime_renews_its_own_leases() {
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = limited_toolbox(&warehouse);
    // A current-thread runtime that gets a renewer (a lease registered while the call waited
    // for its slot), then sits idle.
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let first = idle
        .block_on(toolbox.call("pick", json!({"order": "o-0"}), &ctx()))
        .unwrap();
    assert_eq!(first.value, json!("pick-1"));
    two_workers().block_on(held_pick_keeps_its_lease(
        &toolbox,
        &warehouse,
        "o-1",
        Hold::Gate,
    ));
    drop(idle);
    two_workers().block_on(held_pick_keeps_its_lease(
        &toolbox,
        &warehouse,
        "o-2",
        Hold::Gate,
    ));
    assert_eq!(warehouse.picks(), 3);
}

/// A call made through the handle of a runtime that has shut down, where the renewer's task
/// cannot start (the runtime drops a new task at once), neither hangs nor panics: a body that
/// does not wait runs in its caller's thread and its outcome is answered and recorded.
#[test]
fn a_call_through_the_handle_of_a_runtime_shut_down_ends() {
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = Toolbox::builder()
        .shared_state(warehouse.clone())
        .tool(HeldPick)
        .build()
        .unwrap();
    let rt = two_workers();
    let handle = rt.handle().clone();
    drop(rt);
    let (answered, answer) = std::sync::mpsc::channel();
    std::thread::spawn({
        let toolbox = toolbox.clone();
        move || {
            let ctx = ctx();
            let call = toolbox.call("held_pick", json!({"order": "o-7"}), &ctx);
            let _ = answered.send(handle.block_on(call).map(|out| out.value));
        }
    });
    let answer = answer
        .recv_timeout(Duration::from_secs(10))
        .expect("the call ended");
    assert_eq!(answer.unwrap(), json!("pick-1"));
    assert_eq!(warehouse.picks(), 1);
    let replay = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(toolbox.call("held_pick", json!({"order": "o-7"}), &ctx()))
        .unwrap();
    assert_eq!((replay.value, replay.replayed), (json!("pick-1"), true));
    assert_eq!(warehouse.picks(), 1);
}

/// A runtime of two workers.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// How a pick's body holds on past three leases of 300 ms.
enum Hold {
    /// It blocks its thread for 900 ms.
    Block,
    /// It waits at a gate (its thread is free) until the test opens it.
    Gate,
}

/// A pick of `order` whose body holds on past three leases: a retry in its fourth lease finds
/// it in progress (a lease that lapsed would be taken over: the lookup finds no pick, and the
/// retry would run the body again), and after shutdown a retry replays it; one pick more on the
/// ledger.
async fn held_pick_keeps_its_lease(
    toolbox: &Toolbox,
    warehouse: &Warehouse,
    order: &str,
    hold: Hold,
) {
    let before = warehouse.picks();
    let gate = match hold {
        Hold::Block => {
            *warehouse.block.lock().unwrap() = Duration::from_millis(900);
            None
        }
        Hold::Gate => {
            let gate = Arc::new(tokio::sync::Notify::new());
            *warehouse.gate.lock().unwrap() = Some(gate.clone());
            Some(gate)
        }
    };
    let err = toolbox
        .call("pick", json!({ "order": order }), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Timeout), "{err:?}");
    // Past the 300 ms lease, while the body still holds on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let err = toolbox
        .call("pick", json!({ "order": order }), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    if let Some(gate) = gate {
        *warehouse.gate.lock().unwrap() = None;
        gate.notify_waiters();
    }
    assert!(toolbox.shutdown().await.is_clean());
    *warehouse.block.lock().unwrap() = Duration::ZERO;
    let replay = toolbox
        .call("pick", json!({ "order": order }), &ctx())
        .await
        .unwrap();
    let expected = format!("pick-{}", before + 1);
    assert_eq!((replay.value, replay.replayed), (json!(expected), true));
    assert_eq!(warehouse.picks(), before + 1, "one pick more on the ledger");
}

/// Pick an order, looked up before a retry acts; a short lease and no timeout, so the call runs
/// in its caller's task until its first wait.
#[tool(idempotent(key = "held-pick:<order>", recover = find_pick), lease = "300ms")]
async fn held_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    Ok(warehouse.pick(&order).await)
}

/// A body without a timeout that blocks its thread before it ever waits blocks its caller's
/// thread (here the runtime's `block_on`, outside any task), not a worker: its lease is renewed
/// from a task the workers run, so a retry 500 ms in, past the 300 ms lease, finds it in
/// progress instead of taking the key over and picking a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_blocks_its_callers_thread_keeps_its_lease() {
    let warehouse = Arc::new(Warehouse::default());
    *warehouse.block.lock().unwrap() = Duration::from_millis(900);
    let toolbox = Arc::new(
        Toolbox::builder()
            .shared_state(warehouse.clone())
            .tool(HeldPick)
            .build()
            .unwrap(),
    );
    let retry = {
        let toolbox = toolbox.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            toolbox
                .call("held_pick", json!({"order": "o-9"}), &ctx())
                .await
        })
    };
    let first = toolbox
        .call("held_pick", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert_eq!((first.value, first.replayed), (json!("pick-1"), false));
    let err = retry.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    let replay = toolbox
        .call("held_pick", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert_eq!((replay.value, replay.replayed), (json!("pick-1"), true));
    assert_eq!(warehouse.picks(), 1, "one pick on the ledger");
}

/// The outcome's first write fails: it is written again until the store takes it, so the next
/// call, long after the lease would have lapsed, replays it instead of saying "unknown".
#[tokio::test]
async fn an_outcome_whose_write_failed_is_written_again() {
    let clock = Arc::new(ManualClock::new());
    let store = FaultyStore::new(
        MemoryStore::with_clock(clock.clone()),
        Plan::script([
            (Op::Complete, Fault::FailBefore),
            (Op::Complete, Fault::LoseReply),
        ]),
    );
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = toolbox(store, warehouse.clone());
    let first = toolbox
        .call("blind_pick", json!({"order": "o-2"}), &ctx())
        .await
        .unwrap();
    assert_eq!(first.value, json!("pick-1"));
    assert!(toolbox.shutdown().await.is_clean());
    clock.advance(Duration::from_secs(60));
    let again = toolbox
        .call("blind_pick", json!({"order": "o-2"}), &ctx())
        .await
        .unwrap();
    assert_eq!((again.value, again.replayed), (json!("pick-1"), true));
    let status = toolbox
        .call("blind_pick_status", json!({"order": "o-2"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "completed");
    assert_eq!(status.value["result"], "pick-1");
    assert_eq!(warehouse.picks(), 1);
}

/// A store that never takes the outcome: shutdown waits its grace, then names what it could not
/// write instead of only logging it.
#[tokio::test]
async fn shutdown_reports_an_outcome_it_could_not_write() {
    let store = FaultyStore::new(
        MemoryStore::new(),
        Plan::random(1).fail_before(1.0).only([Op::Complete]),
    );
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(warehouse.clone())
        .tool(BlindPick)
        .shutdown_grace(Duration::from_millis(200))
        .build()
        .unwrap();
    let out = toolbox
        .call("blind_pick", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.value, json!("pick-1"));
    let report = toolbox.shutdown().await;
    assert_eq!(report.unrecorded.len(), 1, "{report:?}");
    let lost = &report.unrecorded[0];
    assert_eq!(
        (lost.what.as_str(), lost.write),
        ("`blind_pick`", "outcome")
    );
    assert_eq!(lost.tenant, "acme-corp");
    assert!(!lost.key_hash.contains("o-3"), "keys appear only as hashes");
    assert_eq!(warehouse.picks(), 1);
}

/// A reserve applied with its reply lost: the call answers STORE_UNAVAILABLE, "nothing was
/// done", and that stays true: its reservation is released, so the retry runs at once.
#[tokio::test]
async fn a_reserve_whose_reply_was_lost_leaves_the_key_usable() {
    let store = FaultyStore::new(
        MemoryStore::new(),
        Plan::script([(Op::Reserve, Fault::LoseReply)]),
    );
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = toolbox(store, warehouse.clone());
    let err = toolbox
        .call("blind_pick", json!({"order": "o-4"}), &ctx())
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::StoreUnavailable) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(warehouse.picks(), 0, "nothing was done");
    let status = toolbox
        .call("blind_pick_status", json!({"order": "o-4"}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "not_found", "{}", status.value);
    let out = toolbox
        .call("blind_pick", json!({"order": "o-4"}), &ctx())
        .await
        .unwrap();
    assert_eq!((out.value, out.replayed), (json!("pick-1"), false));
    assert_eq!(warehouse.picks(), 1);
}

/// A call whose lease lapsed and was taken over while its body ran says so: LEASE_LOST, not a
/// plain success, since the call that took over may have acted too (here it did: two picks).
#[tokio::test]
async fn a_call_whose_lease_was_taken_over_says_so() {
    taken_over_while_picking("pick", json!("pick-1")).await;
}

/// The same when both bodies return the same result (as a tool returning `()` or a fixed
/// acknowledgement does): the record the call that took over wrote holds an outcome equal to
/// this call's own, and is still not this call's write. It once answered a plain success here.
#[tokio::test]
async fn a_call_whose_lease_was_taken_over_says_so_when_both_results_are_the_same() {
    taken_over_while_picking("ack_pick", json!("picked")).await;
}

/// Pick an order, answering the same acknowledgement every time; a retry looks it up first.
#[tool(idempotent(key = "ack-pick:<order>", recover = find_ack), lease = "300ms")]
async fn ack_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    warehouse.pick(&order).await;
    Ok("picked".to_string())
}

async fn find_ack(warehouse: State<Warehouse>, order: String) -> Result<Option<String>, ToolError> {
    Ok(warehouse.find(&order).map(|_| "picked".to_string()))
}

/// Calls `tool` for an order and holds its body; jumps the store's clock past the lease, so the
/// key reads stale; calls again, which takes the key over, finds no pick and picks
/// (`second` is its result); then lets the first body pick too, and checks what it answers.
async fn taken_over_while_picking(tool: &'static str, second: serde_json::Value) {
    let clock = Arc::new(ManualClock::new());
    let warehouse = Arc::new(Warehouse::default());
    let gate = Arc::new(tokio::sync::Notify::new());
    *warehouse.gate.lock().unwrap() = Some(gate.clone());
    let toolbox = Toolbox::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .shared_state(warehouse.clone())
        .tool(Pick)
        .tool(AckPick)
        .timeout("pick", None)
        .build()
        .unwrap();
    let first = {
        let toolbox = toolbox.clone();
        tokio::spawn(async move { toolbox.call(tool, json!({"order": "o-5"}), &ctx()).await })
    };
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The store's clock jumps past the lease before any renewal: the key reads stale.
    clock.advance(Duration::from_secs(60));
    *warehouse.gate.lock().unwrap() = None;
    let taken = toolbox
        .call(tool, json!({"order": "o-5"}), &ctx())
        .await
        .unwrap();
    assert_eq!((taken.value, taken.replayed), (second, false));
    gate.notify_one();
    let err = first.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::LeaseLost), "{err:?}");
    assert!(err.message().contains("may have happened twice"));
    assert_eq!(warehouse.picks(), 2);
}

/// After a take-over whose lookup found nothing, one renewal holds the lease while the body
/// runs: the lookup's renewal hands over to the body's, instead of both renewing for the
/// body's whole run (a store round trip every lease/3, twice).
#[tokio::test(start_paused = true)]
async fn a_body_after_a_take_over_is_renewed_once_per_period() {
    let warehouse = Arc::new(Warehouse::default());
    warehouse
        .unsure_once
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), Plan::script([])));
    let toolbox = toolbox(store.clone(), warehouse.clone());
    let args = json!({"order": "o-5"});
    let unsure = toolbox
        .call("slow_pick", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(unsure.is(ErrorCode::OutcomeUnknown) && unsure.is_retryable());

    let renews_before = store.calls(Op::Renew);
    let out = toolbox.call("slow_pick", args, &ctx()).await.unwrap();
    assert_eq!(out.value, json!("pick-1"));
    // 3 s of body, renewed every 100 ms: about 30 renewals; two renewals would make about 60.
    let renews = store.calls(Op::Renew) - renews_before;
    assert!((25..=35).contains(&renews), "{renews} renewals");
    assert_eq!(warehouse.picks(), 1);
    assert!(toolbox.shutdown().await.is_clean());
}

/// Pick an order once the gate opens, with no way to look it up; a short lease.
#[tool(
    idempotent(key = "gated-pick:<order>"),
    lease = "300ms",
    timeout = "50ms"
)]
async fn gated_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    Ok(warehouse.pick(&order).await)
}

/// Two calls of `gated_pick` on one store faulted by `renew`, both left running behind the gate:
/// the warehouse, the gate, the store and the toolbox, and a caller that tries `order` once more
/// and hands back the error it gets.
struct Gated {
    warehouse: Arc<Warehouse>,
    gate: Arc<tokio::sync::Notify>,
    store: Arc<FaultyStore<MemoryStore>>,
    toolbox: Toolbox,
}

/// A toolbox of `gated_pick` on `store`, picking in `warehouse`.
fn gated_toolbox(store: &Arc<FaultyStore<MemoryStore>>, warehouse: &Arc<Warehouse>) -> Toolbox {
    Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(warehouse.clone())
        .tool(GatedPick)
        .build()
        .unwrap()
}

impl Gated {
    fn new(renew: Fault) -> Gated {
        let warehouse = Arc::new(Warehouse::default());
        let gate = Arc::new(tokio::sync::Notify::new());
        *warehouse.gate.lock().unwrap() = Some(gate.clone());
        let store = Arc::new(FaultyStore::new(
            MemoryStore::new(),
            Plan::script([(Op::Renew, renew)]),
        ));
        let toolbox = gated_toolbox(&store, &warehouse);
        Gated {
            warehouse,
            gate,
            store,
            toolbox,
        }
    }

    async fn pick(&self, order: &str) -> ToolError {
        self.toolbox
            .call("gated_pick", json!({ "order": order }), &ctx())
            .await
            .unwrap_err()
    }

    /// Opens the gate: each order is picked once, and every outcome is recorded.
    async fn open(self) {
        assert_eq!(self.warehouse.picks(), 0);
        self.gate.notify_waiters();
        assert!(self.toolbox.shutdown().await.is_clean());
        assert_eq!(self.warehouse.picks(), 2);
    }
}

/// A renewal the store holds up holds up no other lease: the first call's renewal hangs and its
/// lease lapses (a retry is told the outcome is unknown), while the second call's lease is
/// renewed all along (a retry finds it in progress). Each order is picked once, when the gate
/// opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_store_holds_up_holds_up_no_other_lease() {
    renewal_held_up().await;
}

/// The same on a current-thread runtime, where each body's own task renews its lease.
#[tokio::test]
async fn a_renewal_the_store_holds_up_holds_up_no_other_lease_on_one_thread() {
    renewal_held_up().await;
}

async fn renewal_held_up() {
    let gated = Gated::new(Fault::Delay(Duration::from_secs(30)));
    // The first call's first renewal (due 100 ms in) is the one held up.
    assert!(gated.pick("o-1").await.is(ErrorCode::Timeout));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(gated.pick("o-2").await.is(ErrorCode::Timeout));
    // Three leases later.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let err = gated.pick("o-1").await;
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    let err = gated.pick("o-2").await;
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    let renewals = gated.store.calls(Op::Renew);
    assert!(
        renewals >= 6,
        "the second lease was renewed every 100 ms: {renewals}"
    );
    gated.open().await;
}

/// A store that panics while renewing a lease stops no renewal: the panic fails that renewal,
/// which is tried again soon, as after any failed renewal. Were the renewal to stop, the first
/// call's lease would lapse under its running body; both calls are still in progress three
/// leases later, and each order is picked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_panics_while_renewing_stops_no_renewal() {
    renewal_panics().await;
}

/// The same on a current-thread runtime, where each body's own task renews its lease.
#[tokio::test]
async fn a_store_that_panics_while_renewing_stops_no_renewal_on_one_thread() {
    renewal_panics().await;
}

async fn renewal_panics() {
    let gated = Gated::new(Fault::Panic);
    assert!(gated.pick("o-1").await.is(ErrorCode::Timeout));
    assert!(gated.pick("o-2").await.is(ErrorCode::Timeout));
    tokio::time::sleep(Duration::from_millis(900)).await;
    for order in ["o-1", "o-2"] {
        let err = gated.pick(order).await;
        assert!(err.is(ErrorCode::InProgress), "{order}: {err:?}");
    }
    assert_eq!(gated.store.injected().failed_before, 1);
    assert!(gated.store.calls(Op::Renew) >= 7);
    gated.open().await;
}

/// An outcome the store does not take is retried in the background, and the lease holds until
/// it lands: on a current-thread runtime too, where the body's own task renewed the lease while
/// the body ran and a task takes over the renewing when the call ends with its write pending.
/// Three leases later a retry is still told the call is in progress, never that its outcome is
/// unknown; once the store takes the write, the retry replays the one pick.
#[tokio::test]
async fn an_outcome_retried_after_the_call_keeps_its_lease_on_one_thread() {
    let warehouse = Arc::new(Warehouse::default());
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        Plan::random(1).fail_before(1.0).only([Op::Complete]),
    ));
    let toolbox = gated_toolbox(&store, &warehouse);
    let args = json!({"order": "o-7"});
    let out = toolbox
        .call("gated_pick", args.clone(), &ctx())
        .await
        .unwrap();
    assert_eq!(out.value, json!("pick-1"));
    tokio::time::sleep(Duration::from_millis(900)).await;
    let err = toolbox
        .call("gated_pick", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    assert!(store.calls(Op::Renew) >= 6, "{}", store.calls(Op::Renew));
    store.stop();
    assert!(toolbox.shutdown().await.is_clean());
    let out = toolbox.call("gated_pick", args, &ctx()).await.unwrap();
    assert!(out.replayed);
    assert_eq!(out.value, json!("pick-1"));
    assert_eq!(warehouse.picks(), 1);
}

/// Pick an order as a step, trying the step again within the call while the store is down.
#[tool(idempotent(key = "step-pick:<order>", status = false))]
async fn step_pick(
    warehouse: State<Warehouse>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    let mut last = None;
    for _ in 0..3 {
        match ctx
            .once("pick", async {
                Ok::<_, ToolError>(warehouse.pick(&order).await)
            })
            .await
        {
            Ok(pick) => return Ok(pick),
            Err(err) if err.is_retryable() => last = Some(err),
            Err(err) => return Err(err),
        }
    }
    Err(last.expect("three tries"))
}

/// A step's reserve applied with its reply lost: the step did not run, its reservation is freed
/// and its name given back, so the body's own retry of the step runs it, once.
#[tokio::test]
async fn a_step_whose_reserve_reply_was_lost_runs_once_when_the_body_tries_it_again() {
    let store = FaultyStore::new(
        MemoryStore::new(),
        // The call's own reserve goes through; the step's first loses its reply.
        Plan::script([
            (Op::Reserve, Fault::Delay(Duration::ZERO)),
            (Op::Reserve, Fault::LoseReply),
        ]),
    );
    let warehouse = Arc::new(Warehouse::default());
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(warehouse.clone())
        .tool(StepPick)
        .build()
        .unwrap();
    let out = toolbox
        .call("step_pick", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert_eq!((out.value, out.replayed), (json!("pick-1"), false));
    let again = toolbox
        .call("step_pick", json!({"order": "o-9"}), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(warehouse.picks(), 1);
    assert!(toolbox.shutdown().await.is_clean());
}

/// Pick an order after a short wait on a timer, then block the thread: a synchronous client
/// called once an asynchronous first step is done.
#[tool(idempotent(key = "late-block-pick:<order>", recover = find_pick), lease = "300ms")]
async fn late_block_pick(warehouse: State<Warehouse>, order: String) -> Result<String, ToolError> {
    let late = warehouse
        .late
        .lock()
        .unwrap()
        .unwrap_or(Duration::from_millis(20));
    tokio::time::sleep(late).await;
    Ok(warehouse.pick(&order).await)
}

/// A body that blocks its worker after a timer woke it keeps its lease. The worker that woke
/// from the runtime's timer driver runs the body, and the other worker sleeps on its own, so no
/// timer of the runtime fires while the body blocks: the renewer, asleep on its timer, renewed
/// nothing, the lease lapsed, and a retry from another runtime at 500 ms took the key over and
/// picked a second time (the first call then answered LEASE_LOST). The watch thread wakes an
/// overdue renewer from outside the runtime: the retry finds the pick in progress, and the
/// ledger has one pick.
#[test]
fn a_body_that_blocks_its_worker_after_a_timer_keeps_its_lease() {
    late_block_keeps_its_lease(MemoryStore::new(), Duration::from_millis(20));
}

/// The same when the worker blocks while a renewal is under way: the renewal waits on the
/// store (here 30 ms, on a timer; a server store waits on the runtime's I/O, which the same
/// stall holds up), and the body, woken at 105 ms, blocks its worker before the renewal
/// started at 100 ms ends. The watch looked only at renewals due, not at those under way: the
/// renewal never ended, the lease lapsed, and the retry picked a second time.
#[test]
fn a_body_that_blocks_its_worker_while_a_renewal_is_under_way_keeps_its_lease() {
    let slow_renewals = (0..20).map(|_| (Op::Renew, Fault::Delay(Duration::from_millis(30))));
    let store = FaultyStore::new(MemoryStore::new(), Plan::script(slow_renewals));
    late_block_keeps_its_lease(store, Duration::from_millis(105));
}

/// A late-blocking pick on a 2-worker runtime, waiting `late` on a timer and then blocking
/// its worker for 900 ms, past three 300 ms leases: a retry from another runtime at 500 ms
/// finds it in progress, and the ledger has one pick.
fn late_block_keeps_its_lease(store: impl Store, late: Duration) {
    let warehouse = Arc::new(Warehouse::default());
    *warehouse.block.lock().unwrap() = Duration::from_millis(900);
    *warehouse.late.lock().unwrap() = Some(late);
    let toolbox = Toolbox::builder()
        .store(store)
        .shared_state(warehouse.clone())
        .tool(LateBlockPick)
        .build()
        .unwrap();
    let call = |toolbox: &Toolbox| {
        let toolbox = toolbox.clone();
        async move {
            toolbox
                .call("late_block_pick", json!({"order": "o-5"}), &ctx())
                .await
        }
    };
    let workers = two_workers();
    let first = workers.spawn(call(&toolbox));
    std::thread::sleep(Duration::from_millis(500));
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = other.block_on(call(&toolbox)).unwrap_err();
    assert!(err.is(ErrorCode::InProgress), "{err:?}");
    let first = workers.block_on(first).unwrap().unwrap();
    assert_eq!((first.value, first.replayed), (json!("pick-1"), false));
    let replay = other.block_on(call(&toolbox)).unwrap();
    assert_eq!((replay.value, replay.replayed), (json!("pick-1"), true));
    assert_eq!(warehouse.picks(), 1, "one pick on the ledger");
}
