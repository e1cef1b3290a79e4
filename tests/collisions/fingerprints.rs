//! Equal arguments have equal fingerprints, whatever their representation: numbers however
//! spelled, sets in any order, and the branch of an untagged enum serde reads.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};
use toolkey::{tool, ErrorCode, Fingerprint, State, Tool, ToolError, Toolbox};

use super::{ctx, toolbox, Outside};

/// Applies a configuration patch to a service: the patch is any JSON.
#[tool(idempotent(key = "patch:<service>", status = false))]
async fn apply_patch(
    out: State<Outside>,
    service: String,
    patch: Value,
) -> Result<usize, ToolError> {
    let _ = patch;
    Ok(out.act(format!("patch:{service}")))
}

#[tokio::test]
async fn a_number_is_one_value_however_large_and_however_spelled() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(ApplyPatch)
        .build()
        .unwrap();
    // The same value spelled as an integer and as a float, within 2^53 and past it.
    for (service, integer, float) in [
        ("s1", json!(100), json!(1e2)),
        ("s2", json!(10_000_000_000_000_000u64), json!(1e16)),
        (
            "s3",
            json!(9_223_372_036_854_775_808u64),
            json!(2f64.powi(63)),
        ),
    ] {
        let first = tb
            .call(
                "apply_patch",
                json!({"service": service, "patch": {"n": integer}}),
                &ctx(),
            )
            .await
            .unwrap();
        let again = tb
            .call(
                "apply_patch",
                json!({"service": service, "patch": {"n": float}}),
                &ctx(),
            )
            .await
            .unwrap();
        assert!(again.replayed, "{service}");
        assert_eq!(again.value, first.value);
    }
    // Values a float cannot tell apart are still two values when sent as integers.
    tb.call(
        "apply_patch",
        json!({"service": "s4", "patch": {"n": 9_007_199_254_740_993u64}}),
        &ctx(),
    )
    .await
    .unwrap();
    let other = tb
        .call(
            "apply_patch",
            json!({"service": "s4", "patch": {"n": 9_007_199_254_740_992u64}}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert!(other.is(ErrorCode::Conflict), "{other:?}");
    assert_eq!(out.count("patch:"), 4);
}

/// Tags a document with a set of labels and per-label weights.
#[tool(idempotent(key = "tag:<doc>", status = false))]
pub(super) async fn tag(
    out: State<Outside>,
    doc: String,
    labels: HashSet<String>,
    weights: HashMap<u32, HashSet<i64>>,
) -> Result<usize, ToolError> {
    let _ = (labels, weights);
    Ok(out.act(format!("tag:{doc}")))
}

#[tokio::test]
async fn the_same_set_retried_is_a_replay_in_any_order() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let labels: Vec<String> = (0..40).map(|i| format!("label-{i}")).collect();
    let args = json!({"doc": "d-1", "labels": labels, "weights": {"1": [3, 1, 2], "7": []}});
    tb.call("tag", args.clone(), &ctx()).await.unwrap();
    for _ in 0..20 {
        let again = tb.call("tag", args.clone(), &ctx()).await.unwrap();
        assert!(again.replayed);
    }
    let mut reversed = labels.clone();
    reversed.reverse();
    let reordered = json!({"doc": "d-1", "labels": reversed, "weights": {"7": [], "1": [2, 3, 1]}});
    assert!(tb.call("tag", reordered, &ctx()).await.unwrap().replayed);
    let other = json!({"doc": "d-1", "labels": ["label-0"], "weights": {}});
    let err = tb.call("tag", other, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict));
    assert_eq!(out.count("tag:"), 1);
}

/// Whom an announcement goes to: everyone, a set of groups, or people in the order given. serde
/// reads an array of names as the first branch that takes it: the set.
#[derive(Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Audience {
    Everyone(bool),
    Groups(HashSet<String>),
    Ordered(Vec<String>),
}

/// The same branches the other way round: an array of names is read as the list.
#[derive(Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Queue {
    Ordered(Vec<String>),
    Groups(HashSet<String>),
}

/// Announces a topic to an audience.
#[tool(idempotent(key = "announce:<topic>"))]
async fn announce(
    out: State<Outside>,
    topic: String,
    audience: Audience,
) -> Result<usize, ToolError> {
    let _ = audience;
    Ok(out.act(format!("announce:{topic}")))
}

/// Calls people in turn, in the order given.
#[tool(idempotent(key = "call-round:<topic>", status = false))]
async fn call_round(out: State<Outside>, topic: String, queue: Queue) -> Result<usize, ToolError> {
    let _ = queue;
    Ok(out.act(format!("call-round:{topic}")))
}

#[tokio::test]
async fn a_set_beside_a_list_in_an_untagged_enum_is_the_branch_serde_reads() {
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(Announce)
        .tool(CallRound)
        .build()
        .unwrap();
    // Enough names that a hash set's order is never the order given by luck.
    let names: Vec<String> = (0..12).map(|i| format!("g{i}")).collect();
    let mut reversed = names.clone();
    reversed.reverse();
    // Read as a set: sent again, in any order, it is the same action.
    let args = json!({"topic": "t", "audience": names});
    tb.call("announce", args.clone(), &ctx()).await.unwrap();
    for _ in 0..10 {
        assert!(
            tb.call("announce", args.clone(), &ctx())
                .await
                .unwrap()
                .replayed
        );
        let status = tb
            .call("announce_status", args.clone(), &ctx())
            .await
            .unwrap();
        assert_eq!(status.value["status"], "completed", "{}", status.value);
    }
    let reordered = json!({"topic": "t", "audience": reversed});
    assert!(
        tb.call("announce", reordered, &ctx())
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(out.count("announce:"), 1);

    // Read as a list: the same order is the same action, another order another one.
    let args = json!({"topic": "t", "queue": names});
    tb.call("call_round", args.clone(), &ctx()).await.unwrap();
    for _ in 0..10 {
        assert!(
            tb.call("call_round", args.clone(), &ctx())
                .await
                .unwrap()
                .replayed
        );
    }
    let reordered = json!({"topic": "t", "queue": reversed});
    let err = tb.call("call_round", reordered, &ctx()).await.unwrap_err();
    assert!(err.is(ErrorCode::Conflict), "{err:?}");
    assert_eq!(out.count("call-round:"), 1);
}

#[test]
fn fingerprints_ignore_set_order_through_prepare() {
    let ctx = ctx();
    let fp = |args: Value| *Tag.prepare(&args, &ctx).unwrap().fingerprint().unwrap();
    // Enough items that a HashSet's iteration order is never its insertion order by luck.
    let labels: Vec<String> = (0..40).map(|i| format!("l{i}")).collect();
    let mut reversed = labels.clone();
    reversed.reverse();
    let a = fp(json!({"doc": "d", "labels": labels, "weights": {"2": [1, 2]}}));
    let b = fp(json!({"doc": "d", "labels": reversed, "weights": {"2": [2, 1]}}));
    for _ in 0..10 {
        assert_eq!(
            fp(json!({"doc": "d", "labels": labels, "weights": {"2": [1, 2]}})),
            a
        );
    }
    let c = fp(json!({"doc": "d", "labels": ["l0", "l1"], "weights": {"2": [1, 2]}}));
    assert_eq!(a, b);
    assert_ne!(a, c);
    let _: Fingerprint = a;
}
