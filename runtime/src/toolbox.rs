//! The toolbox: a registry of tools and their status companions, checked against each other and
//! the state when it is built, and dispatch by name. Running a call is the
//! [executor](crate::exec)'s: the toolbox looks the call up and hands it there.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::admin::Admin;
use crate::approval::Gate;
use crate::context::StateMap;
use crate::exec::{Approver, Executor, ToolOutput};
use crate::lease::ShutdownReport;
use crate::observe::{self, ToolTelemetry};
use crate::stats::Stats;
use crate::status::Companion;
use crate::store::{MemoryStore, RecordKey, Store};
use crate::story::Story;
use crate::texts;
use crate::tool::{RetryLimit, Tool, ToolDefinition, DEFAULT_RETRY_LIMIT};
use crate::{Fingerprint, ToolContext, ToolError};

/// How long `shutdown` waits for outcomes the store did not take at once, unless set.
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why a toolbox could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A transactional tool whose records and writes cannot share a transaction: the toolbox's
    /// store is not a store of the tool's database (given by value with
    /// [`ToolboxBuilder::store`]), or the tool is not keyed.
    #[error("tool `{tool}` writes in a {database} transaction with its key's record: it must be `idempotent`, and the toolbox's store a {database} store given with .store(..)")]
    TransactionStore {
        /// The tool.
        tool: String,
        /// The database it writes in.
        database: crate::store::Database,
    },
    /// Two tools (or a tool and a status companion) have one name.
    #[error("two tools are named `{0}`: tool names must be unique in a toolbox")]
    DuplicateName(String),
    /// A tool name the LLM APIs would refuse.
    #[error("tool name `{0}` is invalid: use 1 to 64 of A-Z a-z 0-9 _ -, not starting with a digit or `-`")]
    InvalidName(String),
    /// A tool needs state the toolbox was not given.
    #[error("tool `{tool}` needs `State<{type_name}>`: add it with Toolbox::builder().state(..)")]
    MissingState {
        /// The tool.
        tool: String,
        /// The state type.
        type_name: &'static str,
    },
    /// A setting (a timeout, a retry limit, a concurrency limit) names a tool the toolbox does
    /// not have.
    #[error("a setting is given for `{0}`, and there is no tool of that name")]
    UnknownTool(String),
    /// `unkeyed` tools without an approver.
    #[error("tools {0:?} are `unkeyed` (effects without a key): give the toolbox an approver with .approver(..)")]
    NoApprover(Vec<String>),
    /// A flattened parameter's field (a flattened enum's branch field or tag) has the name of one
    /// of the tool's own parameters: serde gives it to the parameter, so the flattened one never
    /// gets it, and every call would be refused or would lose the field.
    #[error("tool `{tool}`: a flattened parameter has a field `{field}`, which is the name of the parameter `{parameter}` too: serde gives `{field}` to `{parameter}`, so the flattened parameter never gets it; rename one of them")]
    ShadowedField {
        /// The tool.
        tool: String,
        /// The name both have.
        field: String,
        /// The parameter that takes it, as the arguments' JSON names it.
        parameter: String,
    },
    /// A flattened `Option` the macro could not see (behind a type alias): serde reads one whose
    /// fields do not parse as `None`, so the fields a call gave would be dropped in silence.
    #[error("tool `{tool}`: the flattened parameter `{parameter}` is an `Option`: serde reads it as `None` when its fields do not parse, dropping the fields given; take it unflattened, as a field of its own")]
    FlattenedOption {
        /// The tool.
        tool: String,
        /// The parameter.
        parameter: String,
    },
    /// A flattened enum without a tag (`#[serde(untagged)]`): serde reads the first branch whose
    /// fields parse and drops the fields it does not take, so a call could run as another
    /// branch than the one its fields describe (`{"n": 2.0, "unit": "kg"}` as a measure of 2,
    /// the unit dropped, where a count of 2 kg was meant), and no check of names can see it.
    #[error("tool `{tool}`: a flattened enum has no tag (its branches' fields: {}): serde reads the first branch whose fields parse and drops the fields that branch does not take; give the enum a tag, `#[serde(tag = \"kind\")]`", fields.join(", "))]
    UntaggedFlattenedEnum {
        /// The tool.
        tool: String,
        /// The fields of the enum's branches.
        fields: Vec<String>,
    },
    /// A flattened parameter that takes any field (a map, or a struct or a variant holding one)
    /// would be given a field another flattened parameter reads: serde gives it every field
    /// not taken away before it, so its entries would not be the ones the call gave.
    #[error("tool `{tool}`: the flattened parameter `{map}` takes any field, and serde gives it `{field}` too, which `{parameter}` reads: its entries would not be the ones given; take the map as a field of its own")]
    MapTakesOthersFields {
        /// The tool.
        tool: String,
        /// The parameter that takes any field.
        map: String,
        /// A field another parameter reads.
        field: String,
        /// That parameter.
        parameter: String,
    },
    /// Two tools' key templates can build one key from different values (`order:<id>` builds
    /// `order:o-1:line:2` for the id `o-1:line:2`, as `order:<id>:line:<line>` does for `o-1`
    /// and `2`): a call of one would be refused as the other's `CONFLICT`, or replayed its
    /// result if the fingerprints matched. Tools that share one template exclude each other on
    /// purpose and are not refused.
    #[error("tools `{first}` (key `{first_template}`) and `{second}` (key `{second_template}`) can build the same key from different values, so one tool's call could be refused as the other's CONFLICT: give one of them a namespace of its own, the text before its first placeholder (for example `{renamed}`), or one template for both if they are meant to exclude each other")]
    KeysMayCollide {
        /// The tool registered first.
        first: String,
        /// Its key template.
        first_template: String,
        /// The tool registered second.
        second: String,
        /// Its key template.
        second_template: String,
        /// The second template with a namespace of its own (its tool's name), as an example.
        renamed: String,
    },
}

/// A tool as the toolbox holds it: the definition with this toolbox's overrides applied, and
/// what its spans and metrics are named by.
struct Registered {
    tool: Box<dyn Tool>,
    definition: Arc<ToolDefinition>,
    telemetry: Arc<ToolTelemetry>,
}

enum Entry {
    Tool(Registered),
    // Boxed: a definition is large, and most entries are tools.
    Status(Box<Companion>),
}

struct Inner {
    entries: HashMap<String, Entry>,
    definitions: Vec<ToolDefinition>,
    exec: Arc<Executor>,
}

/// A set of tools, the store that enforces their keys, and the state they share.
///
/// ```
/// use toolkey::Toolbox;
///
/// let toolbox = Toolbox::builder().build().unwrap();
/// assert!(toolbox.definitions().is_empty());
/// ```
#[derive(Clone)]
pub struct Toolbox {
    inner: Arc<Inner>,
}

/// Builds a [`Toolbox`].
#[derive(Default)]
pub struct ToolboxBuilder {
    store: Option<Arc<dyn Store>>,
    /// The store's database, when it is one: what transactional tools write in.
    transactions: Option<crate::store::transaction::Transactions>,
    state: StateMap,
    tools: Vec<Box<dyn Tool>>,
    approver: Option<Arc<dyn Approver>>,
    timeouts: HashMap<String, Option<std::time::Duration>>,
    shutdown_grace: Option<Duration>,
    // Retry limits and concurrency limits.
    default_retry_limit: RetryLimit,
    retry_limits: HashMap<String, RetryLimit>,
    concurrency: HashMap<String, Option<NonZeroUsize>>,
    telemetry: observe::Options,
    gate: Gate,
}

impl ToolboxBuilder {
    /// Overrides the `timeout` a tool declared, for this toolbox: `None` waits until the body
    /// ends. For deployments and tests that need other timings than the attribute's.
    pub fn timeout(
        mut self,
        tool: impl Into<String>,
        timeout: Option<std::time::Duration>,
    ) -> Self {
        self.timeouts.insert(tool.into(), timeout);
        self
    }

    /// The retry limit of every tool that states none (`retry_limit = "..."` in its attribute):
    /// how many retryable failures of one call it accepts within a window before the call is
    /// answered `RETRY_LIMIT`. Default: 10 within 10 minutes; [`RetryLimit::off`] for none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use toolkey::{RetryLimit, Toolbox};
    ///
    /// let toolbox = Toolbox::builder()
    ///     .default_retry_limit(RetryLimit::after(3, Duration::from_secs(300)))
    ///     .build()
    ///     .unwrap();
    /// # drop(toolbox);
    /// ```
    pub fn default_retry_limit(mut self, limit: RetryLimit) -> Self {
        self.default_retry_limit = limit;
        self
    }

    /// Overrides the retry limit a tool declared (or the toolbox's default), for this toolbox:
    /// [`RetryLimit::off`] for a tool whose retryable failures are its way to say "not yet"
    /// (polling), [`RetryLimit::toolbox`] for the toolbox's default.
    pub fn retry_limit(mut self, tool: impl Into<String>, limit: RetryLimit) -> Self {
        self.retry_limits.insert(tool.into(), limit);
        self
    }

    /// Overrides the concurrency limit a tool declared (`concurrency = 2`), for this toolbox:
    /// at most `limit` of its bodies run at once in this process (`None`: no limit). A call
    /// beyond it waits for a slot within the tool's `timeout`, then is answered `BUSY`. The limit
    /// is per process: N processes run up to N times as many.
    pub fn concurrency(mut self, tool: impl Into<String>, limit: Option<NonZeroUsize>) -> Self {
        self.concurrency.insert(tool.into(), limit);
        self
    }

    /// How long [`Toolbox::shutdown`] waits, after the bodies ended, for outcomes the store did
    /// not take at once (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// Records each call's tenant (`ctx.tenant`) on its span as `toolkey.tenant` (off by
    /// default). A tenant names a customer: turn it on where traces may hold that.
    /// See [`observe`] for what a call's span holds.
    pub fn tenant_in_spans(mut self, on: bool) -> Self {
        self.telemetry.tenant = on;
        self
    }

    /// The store that enforces keys ([`MemoryStore`] when not set).
    ///
    /// A [`PostgresStore`](crate::store::PostgresStore) or a
    /// [`SqliteStore`](crate::store::SqliteStore) given here also runs the transactional tools
    /// of its database ([`ToolDefinition::with_transaction`]).
    pub fn store(mut self, store: impl Store) -> Self {
        self.transactions = crate::store::transaction::Transactions::of(&store);
        self.store = Some(Arc::new(store));
        self
    }

    /// A store shared with other toolboxes or code. It runs no transactional tools: give the
    /// store itself with [`store`](Self::store) for those.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.transactions = None;
        self.store = Some(store);
        self
    }

    /// State available to tools as `State<T>`.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(Arc::new(value));
        self
    }

    /// State already behind an `Arc`, shared with the rest of the program.
    pub fn shared_state<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.state.insert(value);
        self
    }

    /// A tool (the unit struct `#[tool]` generates); its status companion comes along.
    pub fn tool(mut self, tool: impl Tool) -> Self {
        self.tools.push(Box::new(tool));
        self
    }

    /// The approver `unkeyed` tools need.
    pub fn approver(mut self, approver: impl Approver) -> Self {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// A rule of this toolbox: a call for which `needs` answers true (given the tool's name and
    /// the arguments as the model sent them, known valid) waits for a person's approval, as
    /// the calls of a tool declared `#[tool(..., approval)]` do. Rules add up: a call any of
    /// them names needs approval.
    ///
    /// The first such call records an approval request bound to the tenant, the tool, the key
    /// (for a call without one, the fingerprint of its whole arguments) and the fingerprint of
    /// its arguments, runs nothing, and is answered `AWAITING_APPROVAL`. Once a person
    /// approved it (through [`Admin::approve`] or `toolkey approvals approve`), the model's
    /// next call with the same arguments runs it, once; a denied request is answered
    /// `APPROVAL_DENIED`. The toolbox never runs a call on approval by itself: the body needs
    /// the calling process's state and context, and its result must reach the model.
    ///
    /// ```
    /// use toolkey::Toolbox;
    ///
    /// // Refunds above 100.00 wait for a person.
    /// let toolbox = Toolbox::builder()
    ///     .require_approval(|tool, args| {
    ///         tool == "refund" && args["amount"].as_f64().is_some_and(|amount| amount > 100.0)
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # drop(toolbox);
    /// ```
    pub fn require_approval(
        mut self,
        needs: impl Fn(&str, &Value) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.gate.rules.push(Arc::new(needs));
        self
    }

    /// A hook told once of every approval request a call of this toolbox records (not when a
    /// later call finds it still open): to tell someone a decision waits. It runs in the
    /// call's task, so it should hand slow work (a message to send) to a task of its own.
    pub fn on_approval_request(
        mut self,
        hook: impl Fn(&crate::store::Approval) + Send + Sync + 'static,
    ) -> Self {
        self.gate.hooks.push(Arc::new(hook));
        self
    }

    /// How long an approval request waits for a decision before it expires (default: a day,
    /// [`DEFAULT_APPROVAL_EXPIRY`](crate::DEFAULT_APPROVAL_EXPIRY)). An expired request never
    /// runs; the next call with the same arguments opens a new one.
    pub fn approval_expiry(mut self, expiry: Duration) -> Self {
        self.gate.expiry = expiry;
        self
    }

    /// How long an approval request is kept after its expiry, decided or not, for audit
    /// (default: 30 days, [`DEFAULT_APPROVAL_RETENTION`](crate::DEFAULT_APPROVAL_RETENTION)).
    pub fn approval_retention(mut self, retention: Duration) -> Self {
        self.gate.retention = retention;
        self
    }

    /// Checks the tools against each other and the state, and builds the toolbox.
    pub fn build(self) -> Result<Toolbox, BuildError> {
        let mut entries = HashMap::new();
        let mut definitions = Vec::new();
        let mut unkeyed = Vec::new();
        let mut add = |name: String, entry: Entry, def: ToolDefinition| {
            if !valid_name(&name) {
                return Err(BuildError::InvalidName(name));
            }
            if entries.insert(name.clone(), entry).is_some() {
                return Err(BuildError::DuplicateName(name));
            }
            definitions.push(def);
            Ok(())
        };
        let mut timeouts = self.timeouts;
        let (mut retry_limits, mut concurrency) = (self.retry_limits, self.concurrency);
        let default_retry_limit = self.default_retry_limit.or(DEFAULT_RETRY_LIMIT);
        let mut slots = Vec::new();
        for tool in self.tools {
            let mut definition = tool.definition();
            if let Some(timeout) = timeouts.remove(&definition.name) {
                definition.settings.timeout = timeout;
            }
            let settings = &mut definition.settings;
            if let Some(limit) = retry_limits.remove(&definition.name) {
                settings.retry_limit = limit;
            }
            settings.retry_limit = settings.retry_limit.or(default_retry_limit);
            if let Some(limit) = concurrency.remove(&definition.name) {
                settings.concurrency = limit;
            }
            if let Some(limit) = settings.concurrency {
                slots.push((definition.name.clone(), limit));
            }
            let reads = definition.flattened_reads();
            if let Some(parameter) = crate::tool::flattened_option(&reads) {
                return Err(BuildError::FlattenedOption {
                    tool: definition.name.clone(),
                    parameter: parameter.to_string(),
                });
            }
            if let Some(fields) = definition.untagged_flattened() {
                return Err(BuildError::UntaggedFlattenedEnum {
                    tool: definition.name.clone(),
                    fields,
                });
            }
            if let Some((map, field, parameter)) = crate::tool::map_takes_others_fields(&reads) {
                return Err(BuildError::MapTakesOthersFields {
                    tool: definition.name.clone(),
                    map,
                    field,
                    parameter,
                });
            }
            if let Some((field, parameter)) = definition.shadowed_field(&reads) {
                return Err(BuildError::ShadowedField {
                    tool: definition.name.clone(),
                    field,
                    parameter,
                });
            }
            for need in &definition.needs {
                if !self.state.contains(need.type_id) {
                    return Err(BuildError::MissingState {
                        tool: definition.name.clone(),
                        type_name: need.type_name,
                    });
                }
            }
            if definition.story == Story::Unkeyed && !definition.settings.approval {
                unkeyed.push(definition.name.clone());
            }
            if let Some(database) = definition.transaction {
                let store = self.transactions.as_ref().map(|t| t.database());
                if store != Some(database) || definition.story != Story::Idempotent {
                    return Err(BuildError::TransactionStore {
                        tool: definition.name.clone(),
                        database,
                    });
                }
            }
            if let Some(companion) = tool.status_companion() {
                let status =
                    Companion::new(&definition, companion.definition.clone(), companion.key);
                add(
                    companion.definition.name.clone(),
                    Entry::Status(Box::new(status)),
                    companion.definition,
                )?;
            }
            definition.nested = crate::schema::Nested::of(&definition.input_schema).map(Arc::new);
            let registered = Registered {
                tool,
                telemetry: ToolTelemetry::new(&definition.name),
                definition: Arc::new(definition.clone()),
            };
            add(definition.name.clone(), Entry::Tool(registered), definition)?;
        }
        let unknown = timeouts.into_keys().chain(retry_limits.into_keys());
        if let Some(name) = unknown.chain(concurrency.into_keys()).min() {
            return Err(BuildError::UnknownTool(name));
        }
        if !unkeyed.is_empty() && self.approver.is_none() {
            return Err(BuildError::NoApprover(unkeyed));
        }
        check_templates(&definitions)?;
        observe::describe();
        let mut exec = Executor::new(
            self.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
            Arc::new(self.state),
            self.approver,
            self.shutdown_grace.unwrap_or(DEFAULT_SHUTDOWN_GRACE),
            self.telemetry,
        )
        .with_transactions(self.transactions);
        for (tool, limit) in slots {
            exec.limit_concurrency(&tool, limit);
        }
        exec.set_gate(self.gate);
        Ok(Toolbox {
            inner: Arc::new(Inner {
                entries,
                definitions,
                exec: Arc::new(exec),
            }),
        })
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Toolbox {
    /// A builder for a toolbox.
    pub fn builder() -> ToolboxBuilder {
        ToolboxBuilder::default()
    }

    /// The definitions of every tool, status companions included, in the order added.
    pub fn definitions(&self) -> &[ToolDefinition] {
        &self.inner.definitions
    }

    /// The definition of one tool.
    pub fn definition(&self, name: &str) -> Option<&ToolDefinition> {
        match self.inner.entries.get(name)? {
            Entry::Tool(registered) => Some(&*registered.definition),
            Entry::Status(status) => Some(status.definition()),
        }
    }

    /// The key template of the record a call of `name` reads or writes: a keyed tool's own, or
    /// its tool's for a status companion.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn record_template(&self, name: &str) -> Option<&str> {
        match self.inner.entries.get(name)? {
            Entry::Tool(registered) => registered.definition.key_template(),
            Entry::Status(status) => self.definition(status.target())?.key_template(),
        }
    }

    /// The store the toolbox uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.inner.exec.store()
    }

    /// Operator operations on the toolbox's store: list, show, resolve, purge. Its logs name a
    /// tenant in clear only when the toolbox's spans may ([`ToolboxBuilder::tenant_in_spans`]).
    pub fn admin(&self) -> Admin {
        let exec = &self.inner.exec;
        Admin::new(exec.store().clone()).tenant_in_logs(exec.tenant_in_spans())
    }

    /// The record a call of `tool` with `args` would use, in `ctx`'s tenant: how an operator
    /// finds "the invoice for acme, 2026-10" without knowing the key's format. `tool` may be a
    /// keyed tool or its status companion. The tool does not run; a tool without a key, an
    /// unknown tool or arguments that do not parse are the errors a call would get.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{tool, ToolContext, ToolError, Toolbox};
    ///
    /// #[tool(idempotent(key = "invoice:<customer>:<period>"))]
    /// /// Sends an invoice.
    /// async fn send_invoice(customer: String, period: String) -> Result<String, ToolError> {
    ///     Ok(format!("{customer}/{period}"))
    /// }
    ///
    /// let toolbox = Toolbox::builder().tool(SendInvoice).build().unwrap();
    /// let ctx = ToolContext::new("run-1").with_tenant("acme-corp");
    /// let key = toolbox
    ///     .record_key("send_invoice", json!({"customer": "acme", "period": "2026-10"}), &ctx)
    ///     .unwrap();
    /// assert_eq!(key.tenant, "acme-corp");
    /// assert!(key.key.starts_with("invoice:"));
    /// ```
    pub fn record_key(
        &self,
        tool: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<RecordKey, ToolError> {
        let key = match self.inner.entries.get(tool) {
            Some(Entry::Tool(registered)) => {
                let call = registered.tool.prepare(&args, ctx)?;
                call.key()
                    .cloned()
                    .ok_or_else(|| texts::no_record_key(tool))?
            }
            Some(Entry::Status(status)) => status.key(args, ctx)?,
            None => return Err(self.unknown_tool(tool)),
        };
        Ok(RecordKey::new(ctx.scope(), key.as_str()))
    }

    /// Counts of what the toolbox did.
    pub fn stats(&self) -> Stats {
        self.inner.exec.stats()
    }

    /// Calls a tool by name with the model's arguments.
    ///
    /// Keyed tools reserve their key before the body runs. When the tool's `timeout` passes —
    /// or this future is dropped — the caller stops waiting but the body goes on and records
    /// its outcome; so do `natural` and `unkeyed` bodies. A call with a `timeout` runs in a task
    /// of its own. A call without one starts in the caller's task, and is answered there if it
    /// ends without waiting; at its first wait it moves to a task of its own. (A `read_only`
    /// tool without a `timeout` is the exception: it runs in the caller's task to its end, and
    /// dropping this future cancels its read, which changes nothing.) So a body can start in the
    /// caller's task and go on in another: do not rely on `tokio::task::try_id` or a task-local
    /// value in a body.
    ///
    /// # Blocking work
    ///
    /// While a keyed body runs, its lease is renewed from a separate task (one per runtime renews
    /// every lease held on it), so a body that blocks its thread (a synchronous client, a
    /// CPU-heavy step) keeps its key — as long as the runtime has another thread to renew from.
    /// On a current-thread runtime, or a multi-thread runtime whose every worker is blocked,
    /// nothing renews and the lease lapses: another call may then take the key over. A renewal
    /// waits on the runtime's timers, and while a worker blocks, no other worker may be driving
    /// them (tokio issue 4730): a thread of the process watches the renewals of multi-thread
    /// runtimes, and wakes a runtime whose renewal is overdue from outside, which sets its timers
    /// going again (a warning is logged the first time). Until then the runtime's other timers,
    /// such as a `timeout`, wait too. Run blocking work with [`tokio::task::spawn_blocking`] (or
    /// `block_in_place`) inside the body. If a lease is lost anyway, the call does not claim
    /// success: it answers `LEASE_LOST` ("the action may have happened twice") and logs it.
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        match self.inner.entries.get(name) {
            Some(Entry::Tool(registered)) => {
                let Registered {
                    tool,
                    definition,
                    telemetry,
                } = registered;
                let exec = &self.inner.exec;
                let answer = exec.call(&**tool, definition, telemetry, args, ctx).await;
                answer
                    .map_err(|err| texts::fit_unknown(err, definition.named(), definition.story()))
            }
            Some(Entry::Status(status)) => {
                let target = match self.inner.entries.get(status.target()) {
                    Some(Entry::Tool(registered)) => {
                        Some((&*registered.tool, &*registered.definition))
                    }
                    _ => None,
                };
                status.answer(&self.inner.exec, target, args, ctx).await
            }
            None => Err(self.unknown_tool(name)),
        }
    }

    /// The record a call of the keyed tool `name` with `args` in `ctx` reserves, and the
    /// fingerprint it reserves it with: where its status and outcome can be read while and
    /// after it runs. `None` for a tool that keeps no record, or arguments it refuses.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn record_of(
        &self,
        name: &str,
        args: &Value,
        ctx: &ToolContext,
    ) -> Option<(RecordKey, Fingerprint)> {
        let Some(Entry::Tool(registered)) = self.inner.entries.get(name) else {
            return None;
        };
        if registered.definition.story != Story::Idempotent {
            return None;
        }
        let definition = &registered.definition;
        let call = definition.prepare(&*registered.tool, args, ctx).ok()?;
        let key = call.key?;
        Some((RecordKey::new(ctx.scope(), key.as_str()), call.fingerprint?))
    }

    /// Waits for every body still running (after its caller timed out or went away), then, up
    /// to the shutdown grace ([`ToolboxBuilder::shutdown_grace`]), for the outcomes the store
    /// did not take at once, and reports those it still has not taken.
    ///
    /// An outcome the store refused (a dropped connection) is never only logged: it is retried,
    /// under the call's renewed lease, until the store takes it or the process exits. Call this
    /// before the process exits, and log or act on [`ShutdownReport::unrecorded`]: each entry is a
    /// key whose work ended and whose record will read as unknown once its lease lapses.
    pub async fn shutdown(&self) -> ShutdownReport {
        self.inner.exec.shutdown().await
    }

    fn unknown_tool(&self, name: &str) -> ToolError {
        self.no_such_tool(texts::unknown_tool(name))
    }

    /// UNKNOWN_TOOL with `message`, suggesting the tools that exist.
    pub(crate) fn no_such_tool(&self, message: String) -> ToolError {
        texts::no_such_tool(message, self.inner.definitions.iter().map(|d| d.name()))
    }
}

/// Refuses two tools whose key templates can build one key from different values.
fn check_templates(definitions: &[ToolDefinition]) -> Result<(), BuildError> {
    let keyed: Vec<(&str, &str)> = definitions
        .iter()
        .filter_map(|def| Some((def.name.as_str(), def.key_template()?)))
        .collect();
    for (n, &(first, first_template)) in keyed.iter().enumerate() {
        for &(second, second_template) in &keyed[n + 1..] {
            if crate::key::templates_overlap(first_template, second_template) {
                let namespace = second_template.split('<').next().unwrap_or_default();
                let renamed = format!("{second}:{}", &second_template[namespace.len()..]);
                return Err(BuildError::KeysMayCollide {
                    first: first.to_owned(),
                    first_template: first_template.to_owned(),
                    second: second.to_owned(),
                    second_template: second_template.to_owned(),
                    renamed,
                });
            }
        }
    }
    Ok(())
}
