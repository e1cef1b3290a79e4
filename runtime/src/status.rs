//! Status companions: what a `<tool>_status` call answers. Its arguments are read as the
//! companion's own (the key's fields) and, when they make one, as a whole call of the tool it
//! reports on, whose key and fingerprint the record is checked against; then the record is read
//! from the store and told as `not_found`, `in_progress`, `completed`, `failed`, `unknown` or
//! `conflict`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::Mark;
use crate::exec::{steps_mark, Executor, ToolOutput};
use crate::observe::{self, StoreOp, ToolTelemetry};
use crate::store::{Outcome, Record, RecordKey, StoreError};
use crate::story::Story;
use crate::texts;
use crate::tool::{Call, KeyFn, Tool, ToolDefinition};
use crate::{Fingerprint, IdempotencyKey, ToolContext, ToolError};

/// A status companion: its definition, the tool it reports on, how it derives that tool's key,
/// and what its spans and metrics are named by.
pub(crate) struct Companion {
    definition: ToolDefinition,
    target: String,
    key: KeyFn,
    telemetry: Arc<ToolTelemetry>,
    /// The names a status call may give without naming a call of the target: the key's fields,
    /// the companion's required ones and the ignored fields, each by all its names. A call that
    /// gives any other name is checked as a whole call of the target.
    key_names: Vec<String>,
    /// The target has arguments its fingerprint covers beside `key_names`: without them, any
    /// status call is a whole call.
    checks_more: bool,
}

/// The names a status call of `companion` may give without naming a call of `target` (see
/// [`Companion::key_names`]).
fn key_names(target: &ToolDefinition, companion: &ToolDefinition) -> Vec<String> {
    let required = companion.input_schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|name| name.as_str().map(str::to_owned));
    let fields: Vec<String> = required
        .chain(target.key_arguments())
        .chain(target.ignored_arguments.iter().cloned())
        .collect();
    fields
        .iter()
        .flat_map(|name| target.names_of(name).map(str::to_owned))
        .collect()
}

/// True when `target` has an argument its fingerprint covers beside `key_names`: a field by
/// which two calls under one key differ.
/// Such a field may also be one of a flattened enum's branch, or any key of a flattened map.
fn checks_more(target: &ToolDefinition, key_names: &[String]) -> bool {
    crate::schema::takes_other_names(&target.input_schema, key_names)
}

impl Companion {
    /// The companion `definition` of `target`, deriving its key with `key`.
    pub(crate) fn new(
        target: &ToolDefinition,
        definition: ToolDefinition,
        key: KeyFn,
    ) -> Companion {
        let key_names = key_names(target, &definition);
        Companion {
            telemetry: ToolTelemetry::new(&definition.name),
            checks_more: checks_more(target, &key_names),
            key_names,
            definition,
            target: target.name.clone(),
            key,
        }
    }

    /// The companion's definition.
    pub(crate) fn definition(&self) -> &ToolDefinition {
        &self.definition
    }

    /// The name of the tool it reports on.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// The key of the target's call that `args` name.
    pub(crate) fn key(&self, args: Value, ctx: &ToolContext) -> Result<IdempotencyKey, ToolError> {
        (self.key)(args, ctx)
    }

    /// The answer to a call of this companion with `args`: `target` is the tool it reports on,
    /// as the toolbox holds it (`None` if the toolbox has none of that name).
    pub(crate) async fn answer(
        &self,
        exec: &Executor,
        target: Option<(&dyn Tool, &ToolDefinition)>,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let Companion {
            target: name,
            telemetry,
            key_names,
            checks_more,
            ..
        } = self;
        let checks_more = *checks_more;
        // Arguments that make a whole call of the target give its key and fingerprint,
        // which the record is checked against: a record another action left under the
        // key is not these arguments' outcome. Arguments that name only the key cannot
        // be checked, even when the target's other arguments all have defaults: the
        // call asked about may have given them. Arguments that give another field but
        // lack one a call needs are answered by key too, their note saying what is
        // missing: the schema lets them leave it out, and the record cannot be checked.
        // Arguments the companion itself refuses are refused, whatever the target would
        // make of them.
        let gives_more = |args: &Value| {
            args.as_object()
                .is_some_and(|fields| fields.keys().any(|name| !key_names.contains(name)))
        };
        let more = gives_more(&args);
        // The companion's own reading, once: the key answered by, or its refusal.
        let by_key = self.key(args.clone(), ctx);
        let mut note = None;
        let whole = match target {
            Some((tool, definition)) if (more || !checks_more) && by_key.is_ok() => {
                let prepare = |args: &Value| definition.prepare(tool, args, ctx);
                let attempt = match prepare(&args) {
                    Ok(call) => Ok(Some(call)),
                    Err(err) if !more => Err(err),
                    // A `null` the target refuses is a field not given, as the
                    // companion's schema (every field beside the key optional) has it.
                    Err(err) => {
                        let mut given = args.clone();
                        if let Some(fields) = given.as_object_mut() {
                            fields.retain(|_, value| !value.is_null());
                        }
                        if given == args {
                            Err(err)
                        } else if gives_more(&given) {
                            prepare(&given).map(Some)
                        } else {
                            // Nothing beside the key but `null`s: the key alone.
                            Ok(None)
                        }
                    }
                };
                match attempt {
                    Ok(call) => call,
                    Err(err) if more && err.mark() == Mark::NotAWholeCall => {
                        note = Some(texts::status_partial_call(name, &err));
                        None
                    }
                    // A value the target refuses: its refusal, naming the field.
                    Err(err) if more => return Err(err),
                    Err(_) => None,
                }
            }
            _ => None,
        };
        // Only a tool that may wait for approval has requests to look at.
        let gated = target.is_some_and(|(_, def)| exec.may_need_approval(def));
        read(exec, telemetry, name, by_key, whole, note, gated, ctx).await
    }
}

/// A status companion's answer: what the store holds, in the caller's tenant, for the key
/// of `args`. `status` names the companion, `target` its tool, for the spans and logs.
/// `whole` is the call of `target` that `args` make, when they make one: its key and
/// fingerprint are checked against the record. Otherwise `by_key`, the key the companion
/// read from the arguments (or its refusal of them), is answered for alone, with `note` (or
/// the key-only note) saying so. `gated`: the target may wait for approval, so a key without
/// a record is looked up among approval requests too.
#[allow(clippy::too_many_arguments)]
async fn read(
    exec: &Executor,
    status: &Arc<ToolTelemetry>,
    target: &str,
    by_key: Result<IdempotencyKey, ToolError>,
    whole: Option<Call>,
    note: Option<String>,
    gated: bool,
    ctx: &ToolContext,
) -> Result<ToolOutput, ToolError> {
    let observed = exec.observe(status, Story::ReadOnly, ctx);
    let keyed = match whole.and_then(|call| Some((call.key?, call.fingerprint?))) {
        Some((key, fingerprint)) => Ok((key, Some(fingerprint))),
        None => by_key.map(|key| (key, None)),
    };
    let answer = match keyed {
        Ok((key, fingerprint)) => {
            let asked = fingerprint.as_ref().map(Fingerprint::to_hex);
            let read = read_record(exec, status.name(), target, &key, fingerprint, note, ctx);
            let read = async {
                match read.await? {
                    out if gated && out.value["status"] == "not_found" => {
                        let request = approval_status(exec, target, &key, asked, ctx).await?;
                        Ok(request.map_or(out, |value| ToolOutput {
                            value,
                            replayed: false,
                        }))
                    }
                    out => Ok(out),
                }
            };
            observed.scope(read).await
        }
        Err(err) => Err(err),
    };
    observed.finish(answer.as_ref().map(|out| out.replayed));
    answer
}

async fn read_record(
    exec: &Executor,
    status: &str,
    target: &str,
    key: &IdempotencyKey,
    fingerprint: Option<Fingerprint>,
    note: Option<String>,
    ctx: &ToolContext,
) -> Result<ToolOutput, ToolError> {
    observe::key(key.as_str());
    let rkey = RecordKey::new(ctx.scope(), key.as_str());
    let record = observe::store(StoreOp::Get, exec.store().get(&rkey))
        .await
        .map_err(StoreError::refusal)?;
    let time = |t| humantime::format_rfc3339_millis(t).to_string();
    if let (Some(record), Some(fingerprint)) = (&record, &fingerprint) {
        if record.fingerprint() != fingerprint {
            tracing::debug!(tool = %status, target = %target, key = %key.for_logs(), "status answered: another action's record");
            return Ok(ToolOutput {
                value: json!({"status": "conflict", "detail": texts::status_conflict(target)}),
                replayed: false,
            });
        }
    }
    let found = record.is_some();
    // No record, yet a failed call may have finished steps, as its retry limit's count
    // remembers (read only here, on a status without a record).
    let steps = match record {
        None => {
            let mark = steps_mark(&rkey);
            let read = observe::store(StoreOp::Failures, exec.store().failures(&mark)).await;
            matches!(read, Ok(n) if n > 0)
        }
        Some(_) => false,
    };
    let mut value = match record {
        None if steps => {
            let detail = texts::status_not_found_after_steps(target);
            json!({"status": "not_found", "detail": detail})
        }
        None => json!({"status": "not_found", "detail": texts::status_not_found(target)}),
        Some(Record::InProgress { since, .. }) => {
            json!({"status": "in_progress", "since": time(since)})
        }
        Some(Record::Stale { since, .. }) => json!({"status": "unknown", "since": time(since)}),
        Some(Record::Completed {
            outcome: Outcome::Ok(result),
            completed_at,
            ..
        }) => {
            json!({"status": "completed", "result": result, "completed_at": time(completed_at)})
        }
        Some(Record::Completed {
            outcome: Outcome::Err(err),
            completed_at,
            ..
        }) => {
            json!({"status": "failed", "error": err.to_json()["error"], "completed_at": time(completed_at)})
        }
    };
    if found && fingerprint.is_none() {
        value["note"] = json!(note.unwrap_or_else(|| texts::status_key_only(target)));
    }
    tracing::debug!(tool = %status, target = %target, key = %key.for_logs(), "status answered");
    Ok(ToolOutput {
        value,
        replayed: false,
    })
}

/// What the latest approval request of `target`'s `key` says, when no record is there: the
/// call waits for a decision (`awaiting_approval`), was denied (`approval_denied`), or was
/// approved and runs at the next call (`approved`). `None` when there is no request, or it
/// expired or was used up: the next call opens a new one. `asked`: the fingerprint of the
/// call asked about, when the arguments make one; a request of other arguments is `conflict`.
async fn approval_status(
    exec: &Executor,
    target: &str,
    key: &IdempotencyKey,
    asked: Option<String>,
    ctx: &ToolContext,
) -> Result<Option<Value>, ToolError> {
    use crate::store::{ApprovalKey, ApprovalStatus};
    let id = ApprovalKey::new(ctx.scope(), target, key.as_str());
    let store = exec.store();
    let Some(request) = store
        .latest_approval(&id)
        .await
        .map_err(StoreError::refusal)?
    else {
        return Ok(None);
    };
    let now = store.now().await.map_err(StoreError::refusal)?;
    let time = |t| humantime::format_rfc3339_millis(t).to_string();
    let revision = request.revision;
    let other = asked.is_some_and(|asked| asked != request.fingerprint);
    Ok(match request.status(now) {
        ApprovalStatus::Pending | ApprovalStatus::Denied | ApprovalStatus::Approved if other => {
            Some(json!({"status": "conflict", "detail": texts::status_conflict(target)}))
        }
        ApprovalStatus::Pending => Some(json!({
            "status": "awaiting_approval",
            "revision": revision,
            "expires_at": time(request.expires_at),
            "detail": texts::status_awaiting_approval(target),
        })),
        ApprovalStatus::Denied => Some(json!({
            "status": "approval_denied",
            "revision": revision,
            "detail": texts::status_approval_denied(target),
        })),
        ApprovalStatus::Approved => Some(json!({
            "status": "approved",
            "revision": revision,
            "detail": texts::status_approved(target),
        })),
        ApprovalStatus::Expired | ApprovalStatus::Used => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A key field's name stays a key name when another field claims it as an alias (serde
    /// reads it as the key field): a status call giving only the key names no call.
    #[test]
    fn a_key_fields_name_is_a_key_name_whatever_else_claims_it() {
        let schema =
            json!({"properties": {"order_id": {}, "reference": {}, "cents": {}, "memo": {}}});
        let target = ToolDefinition::new("refund", "", schema, Story::Idempotent)
            .with_key_template("refund:<order_id>")
            .with_ignored_argument("memo")
            .with_argument_alias("reference", "order_id")
            .with_argument_alias("memo", "note");
        let companion = ToolDefinition::new(
            "refund_status",
            "",
            json!({"required": ["order_id"]}),
            Story::ReadOnly,
        );
        let names = key_names(&target, &companion);
        for name in ["order_id", "memo", "note"] {
            assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
        }
        for name in ["reference", "cents"] {
            assert!(!names.iter().any(|n| n == name), "{name}: {names:?}");
        }
        assert!(checks_more(&target, &names));
        let bare = ToolDefinition::new(
            "close",
            "",
            json!({"properties": {"order_id": {}}}),
            Story::Idempotent,
        )
        .with_key_template("close:<order_id>");
        assert!(!checks_more(&bare, &key_names(&bare, &companion)));
    }
}
