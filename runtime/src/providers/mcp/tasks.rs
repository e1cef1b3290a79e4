//! Long calls as MCP tasks (the Tasks extension, SEP-2663), answered from the toolbox's store.
//!
//! A keyed call of a client that declared the extension, still running after the server's
//! threshold (or past its tool's `timeout`), is answered with a task instead of a result or
//! `TIMEOUT`; the body goes on as it always does. The task is announced only once it exists
//! durably: the call's own record is in progress in the store, and a small task record, under
//! the caller's tenant and owner, names that record. `tasks/get` reads both, on any instance
//! that shares the store, before or after a restart. A call still running in this process when
//! it becomes a task has a third record, its answer: in progress while the call runs (this
//! process renews its lease), then the answer the call gave, which is the task's as it is. So a
//! task follows its own call, whoever holds the key: a duplicate waiting behind another
//! caller's call ends with that call's result marked as a replay, or, when that call freed the
//! key and the duplicate took it, with its own. Should the process stop first, the lease lapses
//! and the call's record says what is known. A task made for a call that met the same
//! call of another caller already running follows that one, and ends with its result marked as
//! a replay, as the call itself would have been answered once it finished. The same caller's
//! call again, while the first runs, is that call: an index record per caller and reservation
//! names its task, so a client whose connection dropped before the task's answer came gets the
//! same task, not a second one.
//!
//! The task id is random (128 bits) and carries nothing else: a task id travels in headers
//! (`Mcp-Name`) and client logs, and the arguments or the key it would otherwise carry can hold
//! personal data. The task record is found under the polling caller's own tenant and owner, so
//! another caller's task id finds nothing. Operators see task records as those of `<tool>:task`;
//! they expire with their call's retention, counted from the task's creation.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rmcp::model::{CreateTaskResult, DetailedTask, GetTaskResult, Task, TaskPayload, TaskStatus};
use rmcp::ErrorData;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{call_tool_result, NO_OUTCOME};
use crate::lease::Renewal;
use crate::providers::{call_arguments, run};
use crate::store::{Outcome, Record, RecordKey, Reservation, Store, StoreError, Token};
use crate::story::Story;
use crate::texts::{self, Named};
use crate::{ErrorCode, Fingerprint, ToolContext, ToolError, ToolOutput, Toolbox};

/// How long a keyed call runs before it continues as a task, unless the server sets it.
pub(super) const DEFAULT_TASK_AFTER: Duration = Duration::from_secs(10);

/// The longest poll interval a task suggests.
const LONGEST_POLL: Duration = Duration::from_secs(1);

/// The shortest: a client polling more often gains nothing.
const SHORTEST_POLL: Duration = Duration::from_millis(100);

/// The task record's reservation, completed as soon as it is made.
const TASK_RECORD_LEASE: Duration = Duration::from_secs(30);

/// Who a task belongs to, besides its tenant: the principal an HTTP request authenticated as,
/// or a session. Only its owner finds a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Owner {
    kind: &'static str,
    id: String,
}

impl Owner {
    /// The tasks of a principal, from any of its sessions and connections.
    pub(super) fn principal(id: &str) -> Owner {
        Owner {
            kind: "principal",
            id: id.to_string(),
        }
    }

    /// The tasks of one session.
    pub(super) fn session(run_id: &str) -> Owner {
        Owner {
            kind: "session",
            id: run_id.to_string(),
        }
    }

    /// The task record of `task_id` in `tenant`. The id's length first, so no owner and task id
    /// can pass for another pair.
    fn record(&self, tenant: &str, task_id: &str) -> RecordKey {
        self.named("mcp-task", tenant, task_id)
    }

    /// The record of the answer of the call `task_id` follows: in progress while the call runs
    /// (its lease renewed by the process running it), then the call's answer.
    fn answer(&self, tenant: &str, task_id: &str) -> RecordKey {
        self.named("mcp-task-answer", tenant, task_id)
    }

    fn named(&self, namespace: &str, tenant: &str, task_id: &str) -> RecordKey {
        let Owner { kind, id } = self;
        RecordKey::new(
            tenant,
            format!("{namespace}:{kind}:{}:{id}:{task_id}", id.len()),
        )
    }
}

/// How a `tools/call` is answered: the call's outcome, or a task that follows it.
pub(super) enum Answer {
    /// The call ended (or stopped waiting) before it became a task.
    Done(Result<ToolOutput, ToolError>),
    /// The call goes on as this task.
    Task(CreateTaskResult),
}

/// The call a task follows: its record, and the fingerprint that record was reserved with.
struct Followed<'a> {
    tool: &'a str,
    record: RecordKey,
    fingerprint: Fingerprint,
    retain: Duration,
}

/// Runs `tools/call` of `name` for a client that accepts tasks: the call's outcome when it ends
/// within `after` (or a non-keyed tool's, however long it takes), else a task that follows it.
pub(super) async fn call(
    toolbox: &Toolbox,
    name: &str,
    arguments: Option<&Value>,
    ctx: &ToolContext,
    owner: &Owner,
    after: Duration,
) -> Answer {
    let definition = match toolbox.definition(name) {
        Some(definition) if definition.story == Story::Idempotent => definition,
        _ => return Answer::Done(run(toolbox, Some(name), arguments, ctx).await),
    };
    let args = match call_arguments(definition, arguments) {
        Ok(args) => args,
        Err(err) => return Answer::Done(Err(err)),
    };
    // Arguments the tool refuses keep no record: the call answers why, at once.
    let Some((record, fingerprint)) = toolbox.record_of(name, &args, ctx) else {
        return Answer::Done(toolbox.call(name, args, ctx).await);
    };
    let followed = Followed {
        tool: name,
        record,
        fingerprint,
        retain: definition.settings.retain,
    };
    // The call runs in a task of its own: once it is a task it goes on there, and whatever it
    // ends with (its own result, another call's replayed, an error) is the task's answer. A
    // duplicate waiting behind another caller's call may replay it, or take the key when that
    // call frees it and act itself: only the call knows which.
    let mut call = {
        let (toolbox, name, ctx) = (toolbox.clone(), name.to_string(), ctx.clone());
        tokio::spawn(async move { toolbox.call(&name, args, &ctx).await })
    };
    let check = tokio::time::sleep(after);
    tokio::pin!(check);
    loop {
        tokio::select! {
            ended = &mut call => {
                let result = ended.unwrap_or_else(|err| Err(texts::task_failed(name, &err.to_string())));
                // The tool's own timeout came first, or the same call already runs: a client
                // that polls needs neither a TIMEOUT nor an IN_PROGRESS.
                let running = |err: &ToolError| {
                    err.is(ErrorCode::Timeout) || err.is(ErrorCode::InProgress)
                };
                if matches!(&result, Err(err) if running(err)) {
                    // IN_PROGRESS: the call running is another caller's, and its result,
                    // when the task ends, a replay for this one.
                    let replay = matches!(&result, Err(err) if err.is(ErrorCode::InProgress));
                    let task = announce(toolbox, &followed, owner, true, after, replay, false).await;
                    if let Some((task, _)) = task {
                        return Answer::Task(task);
                    }
                }
                return Answer::Done(result);
            }
            () = &mut check => {
                let task = announce(toolbox, &followed, owner, false, after, false, true).await;
                if let Some((task, answer)) = task {
                    if let Some(answer) = answer {
                        let store = toolbox.store().clone();
                        tokio::spawn(record_answer(store, answer, followed.retain, call));
                    }
                    return Answer::Task(task);
                }
                // Not reserved yet (a slow store, a duplicate waiting its turn): look again.
                check.as_mut().reset(tokio::time::Instant::now() + poll_interval(after));
            }
        }
    }
}

/// A task for the followed call, once its record is durably in progress (or, when
/// `finished_too`, completed) under its fingerprint, and the task record written; `None` when
/// either is not so, and the caller keeps waiting for the call itself. `replay`: the call
/// followed is another caller's, so the result the task ends with is a replay for this one.
/// `answered`: the call goes on in this process, and its answer will be the task's; the record
/// that answer goes in is reserved first, and returned.
async fn announce(
    toolbox: &Toolbox,
    followed: &Followed<'_>,
    owner: &Owner,
    finished_too: bool,
    after: Duration,
    replay: bool,
    answered: bool,
) -> Option<(CreateTaskResult, Option<Answering>)> {
    let store = toolbox.store();
    // Which reservation the task follows: a later one (a retry, after this call released the
    // key) is another call's, whose progress this task must not report as its own.
    let reserved = match store.get(&followed.record).await {
        Ok(Some(Record::InProgress {
            fingerprint, since, ..
        })) if fingerprint == followed.fingerprint => Some(Some(since)),
        Ok(Some(Record::Completed { fingerprint, .. }))
            if finished_too && fingerprint == followed.fingerprint =>
        {
            Some(None)
        }
        Ok(_) => None,
        Err(err) => {
            tracing::debug!(tool = %followed.tool, error = %err, "toolkey: the call's record could not be read; no task yet");
            None
        }
    };
    let since = reserved?;
    let tenant = &followed.record.tenant;
    // One task per caller and reservation: the same call again while it runs (its task's
    // answer lost on the way, a dropped connection) finds that task rather than a second one.
    let index = match since {
        Some(since) => {
            let reservation = json!([followed.record.key, followed.fingerprint, nanos(since)]);
            let reservation = Fingerprint::of(&reservation).expect("plain JSON");
            let index = owner.named("mcp-task-of", tenant, &reservation.to_hex());
            match claim(store.as_ref(), &index, followed, after).await? {
                Claim::Found(task) => return Some((*task, None)),
                Claim::Claimed(token) => Some((index, token)),
            }
        }
        None => None,
    };
    let task_id = format!("tk-{}", uuid::Uuid::new_v4().simple());
    let created = SystemTime::now();
    let key = owner.record(&followed.record.tenant, &task_id);
    let content = json!({
        "tool": followed.tool,
        "key": followed.record.key,
        "fingerprint": followed.fingerprint,
        "reserved_ns": since.map(nanos),
        "created_at": timestamp(created),
        "replay": replay,
    });
    let fingerprint = Fingerprint::of(&content).expect("a task record is plain JSON");
    // Listed for operators as `<tool>:task`, a name no tool or step can have.
    let label = format!("{}:task", followed.tool);
    let answer = match answered {
        true => {
            let answer = owner.answer(&followed.record.tenant, &task_id);
            let token = Token::generate();
            let reserved = store
                .reserve(&answer, &label, &fingerprint, &token, TASK_RECORD_LEASE)
                .await;
            match reserved {
                Ok(Reservation::Reserved { token, .. }) => Some(Answering {
                    key: answer,
                    token,
                    tool: followed.tool.to_string(),
                    created,
                }),
                Ok(Reservation::Existing(_)) => return None,
                Err(err) => {
                    tracing::debug!(tool = %followed.tool, error = %err, "toolkey: a task's answer record was not reserved; no task yet");
                    let _ = store.release(&answer, &token).await;
                    return None;
                }
            }
        }
        false => None,
    };
    let token = Token::generate();
    let written = async {
        match store
            .reserve(&key, &label, &fingerprint, &token, TASK_RECORD_LEASE)
            .await?
        {
            Reservation::Reserved { token, .. } => {
                store
                    .complete(&key, &token, &Outcome::Ok(content), followed.retain)
                    .await
            }
            Reservation::Existing(_) => Ok(false),
        }
    };
    let written = written.await;
    if !matches!(written, Ok(true)) {
        if let Err(err) = written {
            tracing::warn!(tool = %followed.tool, error = %err, "toolkey: a task record was not written; the call is answered without a task");
            // A reserve whose reply was lost may hold the record: free it.
            let _ = store.release(&key, &token).await;
        }
        if let Some(answer) = &answer {
            let _ = store.release(&answer.key, &answer.token).await;
        }
        if let Some((index, token)) = &index {
            let _ = store.release(index, token).await;
        }
        return None;
    }
    if let Some((index, token)) = &index {
        let named = json!({"task_id": task_id, "created_at": timestamp(created)});
        let written = store
            .complete(index, token, &Outcome::Ok(named), followed.retain)
            .await;
        if !matches!(written, Ok(true)) {
            // Its lease lapses: the same call again waits for its own answer, making no task.
            tracing::warn!(tool = %followed.tool, "toolkey: a task was not indexed by its call");
        }
    }
    tracing::debug!(tool = %followed.tool, "toolkey: the call continues as a task");
    let task = seed(&task_id, created, created, followed.retain, after);
    let task = CreateTaskResult::new(task.with_status_message(texts::task_working(followed.tool)));
    Some((task, answer))
}

/// The answer record of a task whose call goes on in this process, reserved.
struct Answering {
    key: RecordKey,
    token: Token,
    tool: String,
    created: SystemTime,
}

/// What the index of one caller's tasks says for a reservation.
enum Claim {
    /// A task was announced for it: that task.
    Found(Box<CreateTaskResult>),
    /// None was: this caller's task for it is being made, under this token.
    Claimed(Token),
}

/// Claims the index entry `index` (a caller's task for one reservation), or finds the task it
/// names; `None` while another request makes that task, or when the store cannot say.
async fn claim(
    store: &dyn Store,
    index: &RecordKey,
    followed: &Followed<'_>,
    after: Duration,
) -> Option<Claim> {
    let token = Token::generate();
    let label = format!("{}:task", followed.tool);
    let fingerprint = Fingerprint::of(&json!(index.key)).expect("plain JSON");
    let reserved = store
        .reserve(index, &label, &fingerprint, &token, TASK_RECORD_LEASE)
        .await;
    let content = match reserved {
        Ok(Reservation::Reserved { token, .. }) => return Some(Claim::Claimed(token)),
        Ok(Reservation::Existing(Record::Completed {
            outcome: Outcome::Ok(content),
            ..
        })) => content,
        Ok(Reservation::Existing(_)) => return None,
        Err(err) => {
            tracing::debug!(tool = %followed.tool, error = %err, "toolkey: a call's task could not be looked up; no task yet");
            let _ = store.release(index, &token).await;
            return None;
        }
    };
    let task_id = content.get("task_id").and_then(Value::as_str)?;
    let created = content.get("created_at").and_then(Value::as_str)?;
    let created = humantime::parse_rfc3339(created).ok()?;
    let task = seed(task_id, created, created, followed.retain, after);
    let task = task.with_status_message(texts::task_working(followed.tool));
    Some(Claim::Found(Box::new(CreateTaskResult::new(task))))
}

/// Waits for the call a task follows, renewing the lease of the task's answer record meanwhile
/// (so a poll on any instance reads the call as running while this process runs it), then
/// records the call's answer there, as the call would have been answered: with the replay mark
/// exactly when its answer is a replay. Should this process stop first, the lease lapses and
/// polls read the call's own record.
async fn record_answer(
    store: Arc<dyn Store>,
    answering: Answering,
    retain: Duration,
    call: JoinHandle<Result<ToolOutput, ToolError>>,
) {
    let Answering {
        key,
        token,
        tool,
        created,
    } = answering;
    let renewal = Renewal::start(store.clone(), key.clone(), token.clone(), TASK_RECORD_LEASE);
    let result = call
        .await
        .unwrap_or_else(|err| Err(texts::task_failed(&tool, &err.to_string())));
    let mut answer = call_tool_result(&result);
    answer["resultType"] = json!("complete");
    // With the task's creation, so the answer is read whole even once the task record expired.
    let answer = json!({"created_at": timestamp(created), "result": answer});
    let written = store
        .complete(&key, &token, &Outcome::Ok(answer), retain)
        .await;
    drop(renewal);
    if !matches!(written, Ok(true)) {
        tracing::warn!(tool = %tool, "toolkey: a task's answer was not recorded; its polls read the call's record once the answer record's lease lapses");
    }
}

/// The answer to `tasks/get`: the task's status and, once it ended, its result, read from the
/// store under the caller's `tenant` and `owner`.
pub(super) async fn get(
    toolbox: &Toolbox,
    tenant: &str,
    owner: &Owner,
    task_id: &str,
    after: Duration,
) -> Result<GetTaskResult, ErrorData> {
    if let Some(answered) = answered(toolbox, tenant, owner, task_id, after).await? {
        return Ok(answered);
    }
    let found = find(toolbox, tenant, owner, task_id).await?;
    let store = toolbox.store();
    let record = store
        .get(&RecordKey::new(tenant, found.key.as_str()))
        .await
        .map_err(unreadable)?;
    let definition = toolbox.definition(&found.tool);
    let named = match definition {
        Some(definition) => definition.named(),
        None => Named {
            tool: &found.tool,
            status: None,
            per_call: false,
        },
    };
    let finished = |result: Result<ToolOutput, ToolError>| {
        let mut result = call_tool_result(&result);
        result["resultType"] = json!("complete");
        let Value::Object(result) = result else {
            unreachable!("a CallToolResult is an object")
        };
        TaskPayload::Completed { result }
    };
    let (payload, updated) = match record {
        Some(Record::InProgress {
            fingerprint, since, ..
        }) if fingerprint == found.fingerprint
            && found
                .reserved
                .is_none_or(|reserved| reserved == nanos(since)) =>
        {
            (TaskPayload::Working, found.created)
        }
        Some(Record::Completed {
            fingerprint,
            outcome,
            completed_at,
            ..
        }) if fingerprint == found.fingerprint => {
            let result = match outcome {
                Outcome::Ok(value) => Ok(ToolOutput {
                    value,
                    replayed: found.replay,
                }),
                Outcome::Err(err) => Err(err),
            };
            (finished(result), completed_at.max(found.created))
        }
        // The call stopped without recording what it did: a retry must not act blindly.
        Some(Record::Stale {
            fingerprint,
            since,
            reported,
            ..
        }) if fingerprint == found.fingerprint => (
            finished(Err(texts::outcome_unknown(named, since, reported))),
            found.created,
        ),
        // Gone, or another call's now: this one released its key, keeping no outcome. (Once a
        // retry of the same action completes, the task reports that outcome: the action's.)
        _ => (
            finished(Err(texts::task_unrecorded(NO_OUTCOME, named))),
            found.created,
        ),
    };
    let mut task = seed(task_id, found.created, updated, found.retain, after);
    if matches!(payload, TaskPayload::Working) {
        task = task.with_status_message(texts::task_working(&found.tool));
    }
    Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
}

/// What a task's answer record says: the call's answer once it ended, and `working` while it
/// runs, kept for as long as it runs whatever became of the task record (kept for the call's
/// retention from its creation). `None` without one, or once its lease lapsed (the process
/// running the call stopped): the task record and the call's record say the rest.
async fn answered(
    toolbox: &Toolbox,
    tenant: &str,
    owner: &Owner,
    task_id: &str,
    after: Duration,
) -> Result<Option<GetTaskResult>, ErrorData> {
    if !is_task_id(task_id) {
        return Ok(None);
    }
    let record = toolbox
        .store()
        .get(&owner.answer(tenant, task_id))
        .await
        .map_err(unreadable)?;
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let task = match record {
        Some(Record::InProgress { since, .. }) => {
            // No time to live while the call runs: the task is kept until it ends.
            let task = Task::new(
                task_id,
                TaskStatus::Working,
                timestamp(since),
                timestamp(since),
            )
            .with_poll_interval_ms(millis(poll_interval(after)));
            let task = match find(toolbox, tenant, owner, task_id).await {
                Ok(found) => task.with_status_message(texts::task_working(&found.tool)),
                Err(_) => task,
            };
            DetailedTask::new(task, TaskPayload::Working)
        }
        Some(Record::Completed {
            outcome: Outcome::Ok(content),
            completed_at,
            expires_at,
            ..
        }) => {
            let created = content
                .get("created_at")
                .and_then(Value::as_str)
                .and_then(|text| humantime::parse_rfc3339(text).ok());
            let (Some(created), Some(Value::Object(result))) = (created, content.get("result"))
            else {
                tracing::warn!("toolkey: a task's answer record could not be read");
                let problem = "the task's answer record is damaged";
                return Err(ErrorData::internal_error(
                    texts::task_unreadable(problem),
                    None,
                ));
            };
            let retain = expires_at.duration_since(created).unwrap_or_default();
            let updated = completed_at.max(created);
            let task = seed(task_id, created, updated, retain, after);
            let payload = TaskPayload::Completed {
                result: result.clone(),
            };
            DetailedTask::new(task, payload)
        }
        _ => return Ok(None),
    };
    Ok(Some(GetTaskResult::new(task)))
}

/// Checks that the caller has the task `task_id`: `tasks/update` and `tasks/cancel` change
/// nothing (toolkey's calls ask for no input, and a body is never cancelled: cancellation is
/// cooperative, and the task ends as its call does), so they only answer whether it exists.
pub(super) async fn check(
    toolbox: &Toolbox,
    tenant: &str,
    owner: &Owner,
    task_id: &str,
) -> Result<(), ErrorData> {
    if is_task_id(task_id) {
        let key = owner.answer(tenant, task_id);
        let answer = toolbox.store().get(&key).await.map_err(unreadable)?;
        if matches!(
            answer,
            Some(Record::InProgress { .. } | Record::Completed { .. })
        ) {
            return Ok(());
        }
    }
    find(toolbox, tenant, owner, task_id).await.map(drop)
}

/// What a task record says.
struct Found {
    tool: String,
    key: String,
    fingerprint: Fingerprint,
    /// When the reservation the task follows was made (nanoseconds since the epoch, as the
    /// store tells it); `None` when the call had already finished as the task was made.
    reserved: Option<u64>,
    created: SystemTime,
    /// How long the task is kept from its creation: its call's retention.
    retain: Duration,
    /// The task follows another caller's call: its result is a replay for this one.
    replay: bool,
}

async fn find(
    toolbox: &Toolbox,
    tenant: &str,
    owner: &Owner,
    task_id: &str,
) -> Result<Found, ErrorData> {
    let not_found = || ErrorData::invalid_params(texts::TASK_NOT_FOUND, None);
    if !is_task_id(task_id) {
        return Err(not_found());
    }
    let record = toolbox
        .store()
        .get(&owner.record(tenant, task_id))
        .await
        .map_err(unreadable)?;
    let Some(Record::Completed {
        outcome: Outcome::Ok(content),
        completed_at,
        expires_at,
        ..
    }) = record
    else {
        return Err(not_found());
    };
    let text = |field: &str| content.get(field).and_then(Value::as_str);
    let parsed = (|| {
        Some(Found {
            tool: text("tool")?.to_string(),
            key: text("key")?.to_string(),
            fingerprint: serde_json::from_value(content.get("fingerprint")?.clone()).ok()?,
            reserved: content.get("reserved_ns").and_then(Value::as_u64),
            created: humantime::parse_rfc3339(text("created_at")?).ok()?,
            retain: expires_at.duration_since(completed_at).unwrap_or_default(),
            // Absent from a task record written before it was kept.
            replay: content.get("replay").and_then(Value::as_bool) == Some(true),
        })
    })();
    parsed.ok_or_else(|| {
        tracing::warn!("toolkey: a task record could not be read");
        ErrorData::internal_error(texts::task_unreadable("the task record is damaged"), None)
    })
}

/// A task id as [`announce`] makes them: `tk-` and 32 lowercase hex digits.
fn is_task_id(task_id: &str) -> bool {
    task_id.strip_prefix("tk-").is_some_and(|hex| {
        hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

fn unreadable(err: StoreError) -> ErrorData {
    ErrorData::internal_error(texts::task_unreadable(&err.to_string()), None)
}

/// A task's shared fields: kept for `retain` from its creation, polled about as often as the
/// call had run before it became one (within 100 ms and 1 s).
fn seed(
    task_id: &str,
    created: SystemTime,
    updated: SystemTime,
    retain: Duration,
    after: Duration,
) -> Task {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Task::new(
        task_id,
        TaskStatus::Working,
        timestamp(created),
        timestamp(updated),
    )
    .with_ttl_ms(millis(retain))
    .with_poll_interval_ms(millis(poll_interval(after)))
}

fn poll_interval(after: Duration) -> Duration {
    after.clamp(SHORTEST_POLL, LONGEST_POLL)
}

fn nanos(time: SystemTime) -> u64 {
    let since_epoch = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX)
}

fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_task_ids_name_one_record_each() {
        let a = Owner::principal("a:1").record("t", "tk-x");
        let b = Owner::principal("a").record("t", "1:tk-x");
        assert_ne!(a, b);
        assert_ne!(
            Owner::principal("alice").record("t", "tk-1"),
            Owner::session("alice").record("t", "tk-1")
        );
        assert_ne!(
            Owner::principal("alice").record("t", "tk-1"),
            Owner::principal("alice").record("u", "tk-1")
        );
    }

    #[test]
    fn only_ids_this_server_makes_are_looked_up() {
        let id = format!("tk-{}", uuid::Uuid::new_v4().simple());
        assert!(is_task_id(&id));
        for bad in [
            "",
            "tk-",
            "tk-0123",
            &id.to_uppercase(),
            &format!("{id}0"),
            &id.replace("tk-", "tx-"),
        ] {
            assert!(!is_task_id(bad), "{bad}");
        }
    }
}
