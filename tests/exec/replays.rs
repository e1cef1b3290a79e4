//! A replay hands back what ran, to the last bit, falsy and deep results included; a result too
//! deep to record, or a lost reply whose key was taken over, is kept as unknown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use toolkey::store::{ManualClock, MemoryStore, Record, RecordKey, Reservations, Store, Token};
use toolkey::{tool, ErrorCode, State, Tool, ToolContext, ToolError, Toolbox};

use super::ctx;

/// Results of every shape.
#[tool(idempotent(key = "shape:<which>"))]
async fn shape(runs: State<AtomicUsize>, which: String) -> Result<Value, ToolError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(match which.as_str() {
        "unit" => serde_json::to_value(()).unwrap(),
        "zero" => json!(0),
        "false" => json!(false),
        "empty" => json!({}),
        _ => Value::Null,
    })
}

#[tokio::test]
async fn falsy_results_are_recorded_and_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let toolbox = Toolbox::builder()
        .shared_state(runs.clone())
        .tool(Shape)
        .build()
        .unwrap();
    for (which, expected) in [
        ("unit", json!(null)),
        ("zero", json!(0)),
        ("false", json!(false)),
        ("empty", json!({})),
        ("null", json!(null)),
    ] {
        let first = toolbox
            .call("shape", json!({"which": which}), &ctx())
            .await
            .unwrap();
        let again = toolbox
            .call("shape", json!({"which": which}), &ctx())
            .await
            .unwrap();
        assert_eq!((first.value, first.replayed), (expected.clone(), false));
        assert_eq!((again.value, again.replayed), (expected, true));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// A conversion whose rate comes out with all seventeen digits a float can need.
#[tool(idempotent(key = "convert:<order>", status = "convert_status"))]
async fn convert(runs: State<AtomicUsize>, order: String, amount: f64) -> Result<Value, ToolError> {
    let _ = order;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(json!({"booked": amount, "rate": 117.633_311_394_000_17}))
}

/// A replay and a status answer show the float the first call answered, to the last bit: the
/// stores keep results as text, and these floats read back one unit off in a careless reading.
/// (The workspace's test dependencies turn serde_json's exact reading on whatever the runtime
/// asks for; CI also runs the runtime's own unit test of it with a user's features.)
#[tokio::test]
async fn a_float_result_replays_to_the_last_bit() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        (
            "sqlite",
            Arc::new(toolkey::store::SqliteStore::open(dir.path().join("toolkey.db")).unwrap()),
        ),
    ];
    let amounts: [f64; 3] = [
        0.921_568_632_125_854_5,
        10_587.436_593_658_975,
        1.577_777_777_777_000_1,
    ];
    for (name, store) in stores {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .shared_store(store)
            .tool(Convert)
            .build()
            .unwrap();
        let bits = |value: &Value| {
            let number = |field: &str| value[field].as_f64().map(f64::to_bits);
            (number("booked"), number("rate"))
        };
        for (i, amount) in amounts.into_iter().enumerate() {
            let args = json!({"order": format!("o{i}"), "amount": amount});
            let first = toolbox.call("convert", args.clone(), &ctx()).await.unwrap();
            let expected = (
                Some(amount.to_bits()),
                Some(117.633_311_394_000_17_f64.to_bits()),
            );
            assert_eq!((bits(&first.value), first.replayed), (expected, false));
            // The second replay of the memory store copies what its first read kept.
            for _ in 0..2 {
                let again = toolbox.call("convert", args.clone(), &ctx()).await.unwrap();
                assert_eq!(
                    (bits(&again.value), again.replayed),
                    (expected, true),
                    "{name}"
                );
            }
            let status = toolbox.call("convert_status", args, &ctx()).await.unwrap();
            assert_eq!(status.value["status"], "completed", "{name}");
            assert_eq!(bits(&status.value["result"]), expected, "{name}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), amounts.len(), "{name}");
    }
}

/// A result `levels` deep: arrays and objects in turn around a number. (Not with `json!`, which
/// would copy the value built so far at every level.)
fn nested(levels: usize) -> Value {
    let mut value = json!(7);
    for level in 0..levels {
        value = if level % 2 == 0 {
            Value::Array(vec![value])
        } else {
            Value::Object([("in".to_string(), value)].into_iter().collect())
        };
    }
    value
}

#[tool(idempotent(key = "tree:<name>", status = "tree_status"))]
async fn tree(runs: State<AtomicUsize>, name: String, levels: usize) -> Result<Value, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(nested(levels))
}

/// Runs `test` on a runtime whose threads have room for values thousands of levels deep in a
/// debug build (serializing, comparing and dropping one recurses per level).
fn with_deep_stacks<F: std::future::Future<Output = ()>>(
    test: impl FnOnce() -> F + Send + 'static,
) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(test())
        })
        .unwrap()
        .join()
        .unwrap();
}

/// serde_json reads 128 levels at most: a result nested deeper was answered to its first call
/// and recorded, and every replay and status answer after it read the record as corrupt. A
/// result as deep as `MAX_RESULT_DEPTH` replays; one deeper is never recorded, since it could
/// not be read back: the tool acted, so it is kept as unknown and never run again.
#[test]
fn a_deep_result_replays_and_one_too_deep_to_record_is_kept_as_unknown() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .tool(Tree)
            .build()
            .unwrap();
        for (name, levels) in [("past-serde", 200), ("deepest", MAX_RESULT_DEPTH)] {
            let args = json!({"name": name, "levels": levels});
            let first = toolbox.call("tree", args.clone(), &ctx()).await.unwrap();
            let again = toolbox.call("tree", args, &ctx()).await.unwrap();
            assert_eq!((&first.value, first.replayed), (&nested(levels), false));
            assert_eq!((&again.value, again.replayed), (&nested(levels), true));
            let status = toolbox
                .call(
                    "tree_status",
                    json!({"name": name, "levels": levels}),
                    &ctx(),
                )
                .await
                .unwrap();
            assert_eq!(status.value["status"], "completed", "{name}");
            assert_eq!(status.value["result"], nested(levels));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        let args = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        for _ in 0..2 {
            let err = toolbox
                .call("tree", args.clone(), &ctx())
                .await
                .unwrap_err();
            assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
            assert!(!err.is_retryable());
        }
        let err = toolbox
            .call("tree", args.clone(), &ctx())
            .await
            .unwrap_err();
        let first = {
            // The first answer says why; later ones, that nobody knows the outcome.
            let fresh = json!({"name": "too-deep-2", "levels": MAX_RESULT_DEPTH + 1});
            toolbox.call("tree", fresh, &ctx()).await.unwrap_err()
        };
        assert!(
            first.message().contains("nests deeper than 4096 levels"),
            "{first:?}"
        );
        assert!(
            first.suggestion().unwrap().contains("do not repeat"),
            "{first:?}"
        );
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        let status = toolbox.call("tree_status", args, &ctx()).await.unwrap();
        assert_eq!(status.value["status"], "unknown");
        // Each too-deep call ran once: `too-deep` for its first call only, `too-deep-2` once.
        // Every one of the four too-deep calls ended in an unknown outcome: each first call's,
        // counted as a result that does not serialize is, and the two that met `too-deep`'s.
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        assert_eq!(toolbox.stats().unknown, 4);
    });
}

/// Builds a result `levels` deep in a step, counting the step's runs.
#[tool(idempotent(key = "deep-step:<name>"))]
async fn deep_step(
    runs: State<AtomicUsize>,
    ctx: &ToolContext,
    name: String,
    levels: usize,
) -> Result<bool, ToolError> {
    let _ = name;
    let tree: Value = ctx
        .once("build", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(nested(levels))
        })
        .await?;
    Ok(tree == nested(levels))
}

/// A step's result is bound by the same depth as a tool's: one as deep as `MAX_RESULT_DEPTH` is
/// recorded and handed back; one deeper is kept as unknown, and the answer names the step that
/// acted, not the tool.
#[test]
fn a_step_result_too_deep_to_record_is_kept_as_unknown_and_names_the_step() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_state(runs.clone())
            .tool(DeepStep)
            .build()
            .unwrap();
        let deepest = json!({"name": "deepest", "levels": MAX_RESULT_DEPTH});
        for replayed in [false, true] {
            let out = toolbox.call("deep_step", deepest.clone(), &ctx()).await;
            let out = out.unwrap();
            assert_eq!((&out.value, out.replayed), (&json!(true), replayed));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let too_deep = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        let first = toolbox
            .call("deep_step", too_deep.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(first.is(ErrorCode::OutcomeUnknown), "{first:?}");
        assert!(!first.is_retryable());
        assert!(first.message().contains("step `build` acted"), "{first:?}");
        assert!(
            first.message().contains("nests deeper than 4096 levels"),
            "{first:?}"
        );
        let again = toolbox
            .call("deep_step", too_deep, &ctx())
            .await
            .unwrap_err();
        assert!(again.is(ErrorCode::OutcomeUnknown), "{again:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    });
}

/// Says a request went out and its reply was lost.
#[tool(idempotent(key = "lost-reply:<name>"))]
async fn lost_reply(runs: State<AtomicUsize>, name: String) -> Result<u32, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    Err(ToolError::outcome_unknown(
        "the request went out and its reply was lost",
    ))
}

/// Crashes after acting.
#[tool(idempotent(key = "crashes:<name>"))]
async fn crashes(runs: State<AtomicUsize>, name: String) -> Result<u32, ToolError> {
    let _ = name;
    runs.fetch_add(1, Ordering::SeqCst);
    panic!("crashed after acting");
}

/// A call of `tool` (named `name`, with `args`) whose body ends with its outcome unknown, its
/// reservation lapsing while the store is slow to take the unknown mark, and another caller
/// taking the key over meanwhile: the call's answer, and its body's runs.
async fn kept_unknown_after_a_take_over(
    tool: impl Tool,
    name: &str,
    args: Value,
) -> (ToolError, Toolbox, usize) {
    use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
    let clock = Arc::new(ManualClock::new());
    let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
    // The call's unknown mark waits a second; the other caller acts then.
    let store = Arc::new(FaultyStore::new(
        inner.clone(),
        Plan::script([(Op::MarkUnknown, Fault::Delay(Duration::from_secs(1)))]),
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let call = tool.prepare(&args, &ctx()).unwrap();
    let key = RecordKey::new("acme-corp", call.key().unwrap().as_str());
    let toolbox = Toolbox::builder()
        .shared_store(store.clone())
        .shared_state(runs.clone())
        .tool(tool)
        .build()
        .unwrap();
    let call = tokio::spawn({
        let (toolbox, name) = (toolbox.clone(), name.to_string());
        async move { toolbox.call(&name, args, &ctx()).await }
    });
    let marking = async {
        while store.injected().delayed == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), marking)
        .await
        .unwrap_or_else(|_| panic!("{name}: the call never marked its key unknown"));

    clock.advance(Duration::from_secs(31));
    let Some(Record::Stale { token: lapsed, .. }) = inner.get(&key).await.unwrap() else {
        panic!("{name}: the call's reservation has lapsed");
    };
    let other = inner
        .take_over(&key, &lapsed, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the other caller takes the key over");

    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(
            inner.get(&key).await.unwrap(),
            Some(Record::InProgress { .. })
        ),
        "{name}: the other caller's reservation stands, not marked unknown"
    );
    assert!(inner
        .renew(&key, &other, Duration::from_secs(30))
        .await
        .unwrap());
    assert_eq!(store.injected().delayed, 1, "{name}");
    (err, toolbox, runs.load(Ordering::SeqCst))
}

/// A call whose outcome is unknown keeps its key unknown, but only while it still holds the key:
/// when its reservation lapsed and another caller took the key over before the mark landed, the
/// answer says so (LEASE_LOST: another call may act too), not that the record is kept as
/// unknown, and the other caller's reservation stands. The same for every way a body ends
/// unknown: a result too deep to record, a reply it reports lost, a panic.
#[test]
fn an_unknown_outcome_whose_key_was_taken_over_is_answered_as_a_lost_lease() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let too_deep = json!({"name": "lost", "levels": MAX_RESULT_DEPTH + 1});
        let cases = [
            kept_unknown_after_a_take_over(Tree, "tree", too_deep).await,
            kept_unknown_after_a_take_over(LostReply, "lost_reply", json!({"name": "n"})).await,
            kept_unknown_after_a_take_over(Crashes, "crashes", json!({"name": "n"})).await,
        ];
        for (err, toolbox, runs) in cases {
            assert!(err.is(ErrorCode::LeaseLost), "{err:?}");
            assert!(!err.is_retryable());
            assert!(
                err.suggestion().unwrap().contains("do not repeat"),
                "{err:?}"
            );
            assert_eq!(runs, 1);
            assert_eq!(toolbox.stats().unknown, 0);
        }
    });
}

/// Finds a refund whose record is `levels` deep.
#[tool(idempotent(key = "deep-found:<name>", recover = find_deep))]
async fn deep_found(
    runs: State<AtomicUsize>,
    name: String,
    levels: usize,
) -> Result<Value, ToolError> {
    let _ = (name, levels);
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(json!("acted"))
}

async fn find_deep(
    runs: State<AtomicUsize>,
    name: String,
    levels: usize,
) -> Result<Option<Value>, ToolError> {
    let _ = (runs, name);
    Ok(Some(nested(levels)))
}

/// What a recover hook finds is recorded as a body's result is: as deep as `MAX_RESULT_DEPTH`,
/// replayed; deeper, kept as unknown, the hook's finding answered OUTCOME_UNKNOWN; the body never
/// runs.
#[test]
fn a_recovered_result_too_deep_to_record_is_kept_as_unknown() {
    use toolkey::store::MAX_RESULT_DEPTH;
    with_deep_stacks(|| async {
        let clock = Arc::new(ManualClock::new());
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        let runs = Arc::new(AtomicUsize::new(0));
        let toolbox = Toolbox::builder()
            .shared_store(store.clone())
            .shared_state(runs.clone())
            .tool(DeepFound)
            .build()
            .unwrap();
        let deepest = json!({"name": "deepest", "levels": MAX_RESULT_DEPTH});
        let too_deep = json!({"name": "too-deep", "levels": MAX_RESULT_DEPTH + 1});
        for args in [&deepest, &too_deep] {
            // A worker reserved the key and crashed.
            let call = DeepFound.prepare(args, &ctx()).unwrap();
            let key = RecordKey::new("acme-corp", call.key().unwrap().as_str());
            let fingerprint = call.fingerprint().unwrap();
            let token = Token::generate();
            let lease = Duration::from_secs(30);
            store
                .reserve(&key, "tool", fingerprint, &token, lease)
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(31));

        for replayed in [true, true] {
            let out = toolbox
                .call("deep_found", deepest.clone(), &ctx())
                .await
                .unwrap();
            assert_eq!(
                (&out.value, out.replayed),
                (&nested(MAX_RESULT_DEPTH), replayed)
            );
        }
        let err = toolbox
            .call("deep_found", too_deep.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        assert!(
            err.message().contains("nests deeper than 4096 levels"),
            "{err:?}"
        );
        let status = toolbox
            .call("deep_found_status", too_deep, &ctx())
            .await
            .unwrap();
        assert_eq!(status.value["status"], "unknown");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    });
}
