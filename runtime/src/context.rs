//! What a tool body receives besides its arguments: the run context and shared state.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::observe::CallId;
use crate::once::OnceScope;
use crate::{texts, IdempotencyKey, ToolError};

/// Who is calling and where in its run: set by the agent runtime, never by the model.
///
/// Key templates may name its fields (`<ctx.run_id>`, `<ctx.step>`, `<ctx.tenant>`,
/// `<ctx.event_id>`), and records are kept per tenant: one tenant can neither replay nor read
/// another's.
///
/// ```
/// use toolkey::ToolContext;
///
/// let ctx = ToolContext::new("run-7").with_step(4).with_tenant("acme-corp");
/// assert_eq!(ctx.run_id(), "run-7");
/// assert_eq!(ctx.step(), Some(4));
/// assert_eq!(ctx.tenant(), Some("acme-corp"));
/// assert_eq!(ToolContext::new("run-7").step(), None);
/// ```
///
/// # Steps
///
/// A key that uses `<ctx.step>` names one call of a run by its step, so the step must be
/// unique within the run and the same when the run is resumed after a restart: the position
/// of the call in the run's log (its first tool call is step 0, the next one step 1, across
/// every turn). A counter that restarts each turn or each process gives a later call an
/// earlier call's key, and the later call is answered with the earlier one's result. The
/// [provider adapters](crate::providers) derive it from the conversation. A call whose key
/// uses `<ctx.step>` with no step set is refused with `MISSING_CONTEXT` before anything runs.
#[derive(Clone)]
pub struct ToolContext {
    run_id: Arc<str>,
    step: Option<u64>,
    tenant: Option<Arc<str>>,
    event_id: Option<Arc<str>>,
    call_id: Option<CallId>,
    once: Option<Arc<OnceScope>>,
    progress: Option<ProgressSink>,
}

/// Where `ctx.progress(..)` reports to: the MCP request that asked for progress notifications.
/// Awaited by the body, so the reports of one call arrive in the order it made them.
pub(crate) type ProgressSink = Arc<
    dyn Fn(f64, Option<f64>, Option<String>) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

impl ToolContext {
    /// The context of one agent run.
    pub fn new(run_id: impl Into<String>) -> Self {
        ToolContext {
            run_id: Arc::from(run_id.into()),
            step: None,
            tenant: None,
            event_id: None,
            call_id: None,
            once: None,
            progress: None,
        }
    }

    /// The step of the run this call is: its position in the run's log, unique within the run
    /// and stable across a restart (see [Steps](Self#steps)).
    pub fn with_step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }

    /// The tenant the call acts for; records are kept per tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(Arc::from(tenant.into()));
        self
    }

    /// The id of the event (webhook, message) that caused this call, for keys that use
    /// `<ctx.event_id>`.
    pub fn with_event(mut self, event_id: impl Into<String>) -> Self {
        self.event_id = Some(Arc::from(event_id.into()));
        self
    }

    /// The id the model's API gave this tool call (a Chat Completions `tool_calls[].id`, a
    /// Responses `call_id`, an Anthropic `tool_use` id), recorded as `gen_ai.tool.call.id` on
    /// the call's span so a trace joins the model's turn to the tool's run. The
    /// [provider adapters](crate::providers) set it. It names one message, not one action: a
    /// model's retry carries a new id, so it is never part of a key.
    pub fn with_tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.call_id = Some(CallId::Tool(Arc::from(id.into())));
        self
    }

    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn with_mcp_request_id(mut self, id: impl Into<String>) -> Self {
        self.call_id = Some(CallId::McpRequest(Arc::from(id.into())));
        self
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The step, if set.
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The tenant, if set.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The event id, if set.
    pub fn event_id(&self) -> Option<&str> {
        self.event_id.as_deref()
    }

    /// The tool call's id, if the caller gave one (see [`with_tool_call_id`](Self::with_tool_call_id)).
    pub fn tool_call_id(&self) -> Option<&str> {
        match &self.call_id {
            Some(CallId::Tool(id)) => Some(id),
            _ => None,
        }
    }

    pub(crate) fn call_id(&self) -> Option<&CallId> {
        self.call_id.as_ref()
    }

    /// The tenant under which records are kept (`""` when none is set).
    pub(crate) fn scope(&self) -> &str {
        self.tenant.as_deref().unwrap_or("")
    }

    /// The idempotency key of the running call, inside a keyed tool's body.
    ///
    /// Forward it to a provider that takes idempotency keys (Stripe's `Idempotency-Key`), so
    /// the provider enforces the same action too.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.once.as_deref().map(OnceScope::key)
    }

    pub(crate) fn with_call(mut self, once: Arc<OnceScope>) -> Self {
        self.once = Some(once);
        self
    }

    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn with_progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Reports how far a long body has come: `done` of `total` (when known), with a short
    /// message for the person watching.
    ///
    /// Over MCP, when the client asked for progress (a `progressToken` in the request's
    /// `_meta`), each report is a `notifications/progress` to that client, in the order the
    /// body makes them (which also tells a patient client the call is alive). Elsewhere it is a
    /// `tracing` event at debug level. `done` should grow with every report. The message is
    /// shown to people and may reach the model: keep arguments and key values out of it.
    ///
    /// ```
    /// use toolkey::ToolContext;
    ///
    /// # async fn body(ctx: &ToolContext) {
    /// for (i, batch) in ["jan", "feb", "mar"].into_iter().enumerate() {
    ///     // ... import `batch` ...
    ///     ctx.progress(i as f64 + 1.0, Some(3.0), "importing a month").await;
    /// }
    /// # }
    /// ```
    pub async fn progress(&self, done: f64, total: Option<f64>, message: &str) {
        match &self.progress {
            Some(sink) => {
                let message = (!message.is_empty()).then(|| message.to_string());
                sink(done, total, message).await
            }
            None => tracing::debug!(done, total, message, "toolkey: progress"),
        }
    }

    /// Runs one step of a multi-step tool at most once.
    ///
    /// The step is keyed under the parent call's whole key (`email` inside
    /// `invoice:acme:2026-10` is `invoice:acme:2026-10>email`), so it can collide with no other
    /// tool, no other step and not its parent; and it is bound to the parent's fingerprint, so a
    /// call with the same key and other arguments meets a `CONFLICT`, never another action's
    /// step result. A retry of the parent after a crash skips the steps that finished —
    /// returning their recorded results — and runs the missing ones. A step that started and
    /// never recorded its outcome is unknown: the retry answers `OUTCOME_UNKNOWN`, unless the
    /// tool's `recover` hook looked and found nothing, in which case the step runs again (so a
    /// recover hook must look for the effects of every step). Only inside a keyed
    /// (`idempotent`) tool's body.
    ///
    /// Each step of one call needs a name of its own: a name used twice in one call (one after
    /// the other, or at once) is refused (`INTERNAL`, naming the step), since that step would
    /// otherwise be skipped and answered with the first one's result or error; the call's key
    /// is freed, so that it can finish once the code is fixed. A loop names each round
    /// (`send-0`, `send-1`). A step that failed with a retryable error recorded nothing, and may
    /// be tried again under its name.
    ///
    /// Every effect of a tool with steps belongs inside a step. A step that fails in a way safe
    /// to retry (the store could not be reached to reserve it) frees the call's key, and the
    /// retry runs the body again: finished steps replay, but whatever the body did outside its
    /// steps is done again. `toolkey::testing`'s "store fails at a write" row finds such a tool.
    ///
    /// A step hands back its result as a replay would: recorded, then read back into its type.
    /// A result that does not read back (a field serde skips when writing and requires when
    /// reading, a NaN, which JSON writes as `null`) is found at the step's first run, and, the
    /// step having acted, its outcome is unknown (`OUTCOME_UNKNOWN`). A recorded result that no
    /// longer fits a step's changed type is refused (`INTERNAL`), and the call's key freed, not
    /// recorded with that failure: the step never runs again, and the call finishes once the
    /// code reads its result.
    ///
    /// ```text
    /// let invoice = ctx.once("invoice-create", async { billing.create(&customer).await }).await?;
    /// ctx.once("invoice-email", async { mailer.send(&invoice).await }).await?;
    /// ```
    pub async fn once<T, E, F>(&self, step: &str, work: F) -> Result<T, ToolError>
    where
        F: Future<Output = Result<T, E>> + Send,
        T: Serialize + DeserializeOwned,
        E: Into<ToolError>,
    {
        let Some(scope) = &self.once else {
            return Err(texts::step_outside_keyed_tool(step));
        };
        scope.run_step(self.scope(), step, work).await
    }

    /// Runs step `step` at most once, as [`once`](Self::once) does, with its writes in a
    /// PostgreSQL transaction (READ COMMITTED) that commits with the step's record: the step's
    /// outcome is never unknown. `work` writes with `tx` and leaves committing to the step; a
    /// retryable error or a panic rolls its writes back (the step wrote nothing, and runs again
    /// on the next call), a final error is recorded without them. The toolbox's store must be the
    /// [`PostgresStore`](crate::store::PostgresStore) of that database, given with
    /// [`store`](crate::ToolboxBuilder::store).
    ///
    /// ```text
    /// let invoice: i64 = ctx.once_in_postgres("invoice-row", move |tx| Box::pin(async move {
    ///     let row = tx.query_one("INSERT INTO invoices (customer) VALUES ($1) RETURNING id", &[&customer]).await?;
    ///     Ok::<_, ToolError>(row.get(0))
    /// })).await?;
    /// ctx.once("invoice-email", async { mailer.send(invoice).await }).await?;
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn once_in_postgres<T, E, F>(&self, step: &str, work: F) -> Result<T, ToolError>
    where
        F: for<'t> FnOnce(
                &'t tokio_postgres::Transaction<'t>,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<T, E>> + Send + 't>,
            > + Send
            + 'static,
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        E: Into<ToolError> + Send + 'static,
    {
        let Some(scope) = &self.once else {
            return Err(texts::step_outside_keyed_tool(step));
        };
        let name: std::sync::Arc<str> = step.into();
        let work: crate::store::transaction::PgWork = Box::new(move |tx| {
            Box::pin(async move {
                use futures_util::FutureExt;
                let ran = std::panic::AssertUnwindSafe(work(tx)).catch_unwind().await;
                step_value::<T, E>(ran, &name)
            })
        });
        let work = crate::store::transaction::TxWork::Postgres(Some(work));
        let value = scope.run_tx_step(self.scope(), step, work).await?;
        scope.read_back(step, value)
    }

    /// Runs step `step` at most once with its writes in a SQLite transaction that commits with
    /// the step's record, as [`once_in_postgres`](Self::once_in_postgres) does on PostgreSQL.
    /// `work` runs on tokio's blocking pool holding the store's write lock: keep it short. The
    /// toolbox's store must be the [`SqliteStore`](crate::store::SqliteStore) of that file.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn once_in_sqlite<T, E, F>(&self, step: &str, work: F) -> Result<T, ToolError>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        E: Into<ToolError> + Send + 'static,
    {
        let Some(scope) = &self.once else {
            return Err(texts::step_outside_keyed_tool(step));
        };
        let name: std::sync::Arc<str> = step.into();
        let work: crate::store::transaction::SqliteWork = Box::new(move |tx| {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(tx)));
            step_value::<T, E>(ran, &name)
        });
        let work = crate::store::transaction::TxWork::Sqlite(Some(work));
        let value = scope.run_tx_step(self.scope(), step, work).await?;
        scope.read_back(step, value)
    }
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("run_id", &self.run_id)
            .field("step", &self.step)
            .field("tenant", &self.tenant)
            .field("event_id", &self.event_id)
            .field("call_id", &self.call_id)
            .field("key", &self.idempotency_key())
            .finish()
    }
}

/// Shared state put into the toolbox with `Toolbox::builder().state(value)`, injected into
/// every tool parameter typed `State<T>`. Never part of a schema.
///
/// ```
/// use toolkey::State;
///
/// struct Billing { currency: &'static str }
/// fn uses(billing: State<Billing>) -> &'static str { billing.currency }
/// # let _ = uses;
/// ```
pub struct State<T: ?Sized>(pub Arc<T>);

impl<T: ?Sized> Clone for State<T> {
    fn clone(&self) -> Self {
        State(self.0.clone())
    }
}

impl<T: ?Sized> Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for State<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("State").field(&&*self.0).finish()
    }
}

/// The state values of one toolbox, by type.
#[derive(Default, Clone)]
pub struct StateMap {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl StateMap {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        self.values.insert(TypeId::of::<T>(), value);
    }

    pub(crate) fn contains(&self, type_id: TypeId) -> bool {
        self.values.contains_key(&type_id)
    }

    /// The state of type `T`; an error naming the type when the toolbox was built without it.
    pub fn get<T: Send + Sync + 'static>(&self) -> Result<State<T>, ToolError> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|v| v.clone().downcast::<T>().ok())
            .map(State)
            .ok_or_else(|| texts::no_state(std::any::type_name::<T>()))
    }
}

/// What a transactional step's work ended in, as its record keeps it: its result as JSON, or
/// its error. A panic, or a result that would not read back into its type or nests too deep,
/// rolls the step back: nothing of it is kept, and the step says so.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn step_value<T, E>(
    ran: Result<Result<T, E>, Box<dyn std::any::Any + Send>>,
    step: &str,
) -> Result<serde_json::Value, ToolError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    E: Into<ToolError>,
{
    let Ok(ran) = ran else {
        return Err(texts::step_rolled_back(step));
    };
    let value = ran.map_err(Into::into)?;
    let unfit = |problem: &dyn fmt::Display| {
        tracing::error!(step, problem = %problem, "a transactional step's result cannot be recorded; rolled back");
        texts::step_rolled_back(step)
    };
    let value = serde_json::to_value(&value).map_err(|e| unfit(&e))?;
    if crate::store::nests_deeper(&value, crate::store::MAX_RESULT_DEPTH) {
        return Err(unfit(&"it nests too deep"));
    }
    T::deserialize(&value).map_err(|e| unfit(&e))?;
    Ok(value)
}
