//! An effect that happened is never recorded as failed: a result that cannot be recorded, an
//! unknown step, a panicking step and a step result that would not read back each leave the key
//! to an answer a model can follow.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;
use serde_json::json;
use toolkey::store::MemoryStore;
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};

use super::{ctx, toolbox, Outside};

// ---------------------------------------------------------------------------------------------
// An effect that happened is never recorded as failed.

/// A layout whose map is keyed by pairs: the type does not show it, so only running finds out.
#[derive(Serialize, schemars::JsonSchema)]
pub(super) struct SeatLayout {
    seats: HashMap<Seat, String>,
}

#[derive(Serialize, schemars::JsonSchema, PartialEq, Eq, Hash)]
struct Seat {
    row: u32,
    letter: char,
}

/// Assigns seats on a flight and returns the layout.
#[tool(idempotent(key = "layout:<flight>", status = "layout_status"))]
pub(super) async fn layout(out: State<Outside>, flight: u32) -> Result<SeatLayout, ToolError> {
    out.act(format!("layout:{flight}"));
    let mut seats = HashMap::new();
    seats.insert(
        Seat {
            row: 1,
            letter: 'A',
        },
        "taken".to_string(),
    );
    Ok(SeatLayout { seats })
}

#[tokio::test]
async fn a_result_that_cannot_be_recorded_is_unknown_not_failed() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let err = tb
        .call("layout", json!({"flight": 7}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(err.message().contains("acted"), "{err}");
    assert!(!err.is_retryable());
    let status = tb
        .call("layout_status", json!({"flight": 7}), &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown");
    let again = tb
        .call("layout", json!({"flight": 7}), &ctx())
        .await
        .unwrap_err();
    assert!(again.is(ErrorCode::OutcomeUnknown));
    assert_eq!(out.count("layout:"), 1, "the retry did not act again");
}

// ---------------------------------------------------------------------------------------------
// An unknown step has a way out, and "retryable" is only said when a retry can succeed.

/// Ships an order in one step whose first reply is lost; the recover hook looks the shipment up.
#[tool(idempotent(key = "ship:<order>", status = false, recover = find_shipment))]
pub(super) async fn ship(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    ship_once(&out, ctx, &order).await
}

async fn ship_once(out: &Outside, ctx: &ToolContext, order: &str) -> Result<String, ToolError> {
    ctx.once("label", async {
        if out.ship_reply_lost_once.swap(false, Ordering::SeqCst) {
            // The request never reached the carrier, but the client cannot tell.
            return Err(ToolError::outcome_unknown("the carrier did not answer"));
        }
        Ok::<_, ToolError>(format!(
            "label-{}-{order}",
            out.act(format!("ship:{order}"))
        ))
    })
    .await
}

/// Looks for a shipment of the order at the carrier.
async fn find_shipment(
    out: State<Outside>,
    _ctx: &ToolContext,
    order: String,
) -> Result<Option<String>, ToolError> {
    out.act("lookup");
    Ok(out
        .effects
        .lock()
        .unwrap()
        .iter()
        .position(|e| *e == format!("ship:{order}"))
        .map(|i| format!("label-{}-{order}", i + 1)))
}

/// The same shipping tool, without a recover hook.
#[tool(idempotent(key = "ship-plain:<order>", status = false))]
pub(super) async fn ship_no_hook(
    out: State<Outside>,
    ctx: &ToolContext,
    order: String,
) -> Result<String, ToolError> {
    ship_once(&out, ctx, &order).await
}

#[tokio::test]
async fn an_unknown_step_is_run_again_once_the_recover_hook_finds_nothing() {
    let out = Arc::new(Outside::default());
    out.ship_reply_lost_once.store(true, Ordering::SeqCst);
    let tb = toolbox(&out);
    let err = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown));
    assert!(err.is_retryable(), "the retry looks before it acts");
    // The retry the answer invites succeeds: the hook finds nothing, the step runs again.
    let out2 = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out2.value, json!("label-2-o-3"));
    let again = tb
        .call("ship", json!({"order": "o-3"}), &ctx())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(out.count("ship:"), 1);
    assert_eq!(out.count("lookup"), 1);
}

#[tokio::test]
async fn without_a_hook_an_unknown_step_is_never_called_retryable() {
    let out = Arc::new(Outside::default());
    out.ship_reply_lost_once.store(true, Ordering::SeqCst);
    let tb = toolbox(&out);
    for _ in 0..3 {
        let err = tb
            .call("ship_no_hook", json!({"order": "o-4"}), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown));
        assert!(!err.is_retryable(), "nothing a retry does can change it");
    }
    assert_eq!(out.count("ship:"), 0);
}

// ---------------------------------------------------------------------------------------------
// A step's panic names the step and the key's hash, never its values.

/// Sends a customer's statement; its email step panics.
#[tool(idempotent(key = "statement:<email>", status = false))]
pub(super) async fn statement(ctx: &ToolContext, email: String) -> Result<(), ToolError> {
    ctx.once("send", async {
        if !email.is_empty() {
            panic!("smtp refused");
        }
        Ok::<_, ToolError>(())
    })
    .await
}

#[tokio::test]
async fn a_panicking_step_names_itself_and_a_hash_not_the_key() {
    let out = Arc::new(Outside::default());
    let tb = toolbox(&out);
    let err = tb
        .call(
            "statement",
            json!({"email": "jane.doe@example.com"}),
            &ctx(),
        )
        .await
        .unwrap_err();
    let text = err.to_json().to_string();
    assert!(err.is(ErrorCode::OutcomeUnknown));
    assert!(text.contains("step `send`"), "{text}");
    assert!(text.contains("key hash"), "{text}");
    assert!(!text.contains("jane"), "{text}");
    assert!(!text.contains("example.com"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// A step's result must read back into its type: a replay hands back what the record holds.

/// A contact as a CRM client might declare it: its tags left out of the text when empty, and
/// required when read (no `#[serde(default)]`).
#[derive(Serialize, serde::Deserialize)]
struct Contact {
    id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
}

/// Creates a contact with `tags` as a step, and answers its id.
#[tool(idempotent(key = "contact:<email>"))]
async fn create_contact(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
    tags: Vec<String>,
) -> Result<String, ToolError> {
    let contact: Contact = ctx
        .once("create", async {
            let n = out.act(format!("contact:{email}"));
            Ok::<_, ToolError>(Contact {
                id: format!("c-{n}"),
                tags,
            })
        })
        .await?;
    Ok(contact.id)
}

/// Measures once; a broken sensor reads NaN, which JSON writes as `null`.
#[tool(idempotent(key = "measure:<probe>"))]
async fn measure(out: State<Outside>, ctx: &ToolContext, probe: String) -> Result<f64, ToolError> {
    ctx.once("read", async {
        out.act(format!("measure:{probe}"));
        Ok::<_, ToolError>(if probe == "broken" { f64::NAN } else { 21.5 })
    })
    .await
}

#[tokio::test]
async fn a_step_result_that_would_not_read_back_is_unknown_at_its_first_run() {
    // Recorded as it was, the contact without tags would read back on no replay ("missing
    // field"): the step acted, so its outcome is unknown (never a recorded failure, never a
    // second contact), and the first run says so rather than a later replay.
    let out = Arc::new(Outside::default());
    let tb = Toolbox::builder()
        .shared_state(out.clone())
        .tool(CreateContact)
        .tool(Measure)
        .build()
        .unwrap();
    let bare = json!({"email": "ann@example.com", "tags": []});
    for first in [true, false] {
        let err = tb
            .call("create_contact", bare.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
        assert!(!err.is_retryable());
        // The first answer names the step and what would not read back; a retry meets the
        // call kept unknown.
        let says = match first {
            true => ["step `create` acted", "missing field `tags`"],
            false => ["could not tell whether it acted", "create_contact"],
        };
        assert!(says.iter().all(|s| err.message().contains(s)), "{err}");
    }
    let status = tb
        .call("create_contact_status", bare, &ctx())
        .await
        .unwrap();
    assert_eq!(status.value["status"], "unknown", "{}", status.value);
    assert_eq!(out.count("contact:ann@"), 1);

    // A contact whose text holds every field reads back: created once, then replayed.
    let tagged = json!({"email": "bob@example.com", "tags": ["vip"]});
    for replayed in [false, true] {
        let created = tb
            .call("create_contact", tagged.clone(), &ctx())
            .await
            .unwrap();
        assert_eq!((created.value, created.replayed), (json!("c-2"), replayed));
    }
    assert_eq!(out.count("contact:bob@"), 1);

    let err = tb
        .call("measure", json!({"probe": "broken"}), &ctx())
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert!(err.message().contains("step `read` acted"), "{err}");
    let read = tb
        .call("measure", json!({"probe": "ok"}), &ctx())
        .await
        .unwrap();
    assert_eq!(read.value, json!(21.5));
    assert_eq!(
        (out.count("measure:broken"), out.count("measure:ok")),
        (1, 1)
    );
}

/// Creates a contact as a step (its id as text), then welcomes it; the mailer is down at first.
#[tool(idempotent(key = "onboard:<email>"))]
async fn onboard(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
) -> Result<String, ToolError> {
    let id: String = ctx
        .once("create", async {
            Ok::<_, ToolError>(format!("c-{}", out.act(format!("create:{email}"))))
        })
        .await?;
    if out.count("outage") == 0 {
        out.act("outage");
        return Err(
            ToolError::new("MAIL_DOWN", "the mailer is down; no welcome was sent")
                .with_retryable(true),
        );
    }
    out.act(format!("welcome:{id}"));
    Ok(id)
}

/// The same tool after a release that changed what its step answers: a contact, not its id.
#[tool(name = "onboard", idempotent(key = "onboard:<email>"))]
async fn onboard_changed(
    out: State<Outside>,
    ctx: &ToolContext,
    email: String,
) -> Result<String, ToolError> {
    out.act("changed-body");
    let contact: Contact = ctx
        .once("create", async {
            let n = out.act(format!("create:{email}"));
            Ok::<_, ToolError>(Contact {
                id: format!("c-{n}"),
                tags: vec!["new".into()],
            })
        })
        .await?;
    Ok(contact.id)
}

#[tokio::test]
async fn a_step_record_that_no_longer_fits_its_type_frees_the_key_until_the_code_reads_it() {
    // The contact was created, then the mailer failed: the key was freed, the step's record
    // kept. The changed code cannot read that record. Recording its failure as the call's outcome
    // would answer it forever: the key is freed again, so the call finishes once code that reads
    // the record runs, and the contact is never created twice.
    let out = Arc::new(Outside::default());
    let store = Arc::new(MemoryStore::new());
    let build = |tool: &dyn Fn(toolkey::ToolboxBuilder) -> toolkey::ToolboxBuilder| {
        tool(
            Toolbox::builder()
                .shared_state(out.clone())
                .shared_store(store.clone()),
        )
        .build()
        .unwrap()
    };
    let before = build(&|b| b.tool(Onboard));
    let changed = build(&|b| b.tool(OnboardChanged));
    let args = json!({"email": "ann@example.com"});
    let err = before
        .call("onboard", args.clone(), &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "MAIL_DOWN");
    for _ in 0..2 {
        let err = changed
            .call("onboard", args.clone(), &ctx())
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::Internal), "{err:?}");
        assert!(
            err.message()
                .contains("the recorded result of step `create` no longer fits its type"),
            "{err}"
        );
        // serde's account names the recorded value; the model is not shown it.
        assert!(!err.message().contains("c-1"), "{err}");
        assert!(!err.is_retryable() && err.suggestion().is_some(), "{err:?}");
    }
    // Each call ran the body: neither was answered from a recorded failure.
    assert_eq!(out.count("changed-body"), 2);
    let done = before.call("onboard", args.clone(), &ctx()).await.unwrap();
    assert_eq!((done.value, done.replayed), (json!("c-1"), false));
    let again = before.call("onboard", args, &ctx()).await.unwrap();
    assert!(again.replayed);
    assert_eq!((out.count("create:"), out.count("welcome:c-1")), (1, 1));
}
