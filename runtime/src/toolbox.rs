//! The toolbox: a registry of tools, dispatch by name, and the entry point of every call.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long `shutdown` waits for outcomes the store did not take at once, unless set.
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

use async_trait::async_trait;
use futures_util::FutureExt;
use serde_json::{json, Value};
use tokio_util::task::TaskTracker;

use crate::context::StateMap;
use crate::exec::{self, panicked};
use crate::lease::{Recorder, ShutdownReport};
use crate::store::{MemoryStore, Outcome, Record, RecordKey, Store};
use crate::texts;
use crate::tool::{Invocation, KeyFn, Story, Tool, ToolDefinition};
use crate::{ToolContext, ToolError};

/// What a successful call returns.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolOutput {
    /// The tool's result as JSON.
    pub value: Value,
    /// True when this is the recorded result of an earlier call, not a new execution.
    pub replayed: bool,
}

/// Counts of what the toolbox did, since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Bodies started.
    pub executed: u64,
    /// Calls answered with a recorded outcome.
    pub replayed: u64,
    /// Calls refused because the same key was running.
    pub in_progress: u64,
    /// Calls refused because the same key was used with other arguments.
    pub conflicts: u64,
    /// Calls whose caller stopped waiting.
    pub timeouts: u64,
    /// Reservations released after a retryable error.
    pub released: u64,
    /// Stale reservations taken over and handed to a recover hook.
    pub recovered: u64,
    /// Calls that ended in an unknown outcome.
    pub unknown: u64,
}

#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) executed: Counter,
    pub(crate) replayed: Counter,
    pub(crate) in_progress: Counter,
    pub(crate) conflicts: Counter,
    pub(crate) timeouts: Counter,
    pub(crate) released: Counter,
    pub(crate) recovered: Counter,
    pub(crate) unknown: Counter,
}

/// Decides whether an `unkeyed` tool may run. Every toolbox holding an `unkeyed` tool needs one.
///
/// A closure `Fn(&ApprovalRequest) -> bool` is an approver; implement the trait for one that
/// asks a person.
#[async_trait]
pub trait Approver: Send + Sync + 'static {
    /// True to let the call run.
    async fn approve(&self, request: &ApprovalRequest<'_>) -> bool;
}

#[async_trait]
impl<F> Approver for F
where
    F: Fn(&ApprovalRequest<'_>) -> bool + Send + Sync + 'static,
{
    async fn approve(&self, request: &ApprovalRequest<'_>) -> bool {
        self(request)
    }
}

/// One call of an `unkeyed` tool, waiting for approval.
#[derive(Debug)]
#[non_exhaustive]
pub struct ApprovalRequest<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The arguments, as the model sent them (already valid).
    pub arguments: &'a Value,
    /// The caller's context.
    pub context: &'a ToolContext,
}

/// Why a toolbox could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
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
    /// A setting names a tool the toolbox does not have.
    #[error("a timeout is set for `{0}`, and there is no tool of that name")]
    UnknownTool(String),
    /// `unkeyed` tools without an approver.
    #[error("tools {0:?} are `unkeyed` (effects without a key): give the toolbox an approver with .approver(..)")]
    NoApprover(Vec<String>),
}

pub(crate) struct Registered {
    pub(crate) tool: Box<dyn Tool>,
    pub(crate) definition: ToolDefinition,
}

pub(crate) struct StatusEntry {
    definition: ToolDefinition,
    target: String,
    key: KeyFn,
}

enum Entry {
    Tool(Arc<Registered>),
    Status(Arc<StatusEntry>),
}

pub(crate) struct Inner {
    entries: HashMap<String, Entry>,
    definitions: Vec<ToolDefinition>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) state: Arc<StateMap>,
    approver: Option<Arc<dyn Approver>>,
    pub(crate) stats: Counters,
    tracker: TaskTracker,
    pub(crate) recorder: Arc<Recorder>,
    shutdown_grace: Duration,
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
    state: StateMap,
    tools: Vec<Box<dyn Tool>>,
    approver: Option<Arc<dyn Approver>>,
    timeouts: HashMap<String, Option<std::time::Duration>>,
    shutdown_grace: Option<Duration>,
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

    /// How long [`Toolbox::shutdown`] waits, after the bodies ended, for outcomes the store did
    /// not take at once (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// The store that enforces keys ([`MemoryStore`] when not set).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store shared with other toolboxes or code.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
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
        for tool in self.tools {
            let mut definition = tool.definition();
            if let Some(timeout) = timeouts.remove(&definition.name) {
                definition.settings.timeout = timeout;
            }
            for need in &definition.needs {
                if !self.state.contains(need.type_id) {
                    return Err(BuildError::MissingState {
                        tool: definition.name.clone(),
                        type_name: need.type_name,
                    });
                }
            }
            if definition.story == Story::Unkeyed {
                unkeyed.push(definition.name.clone());
            }
            if let Some(companion) = tool.status_companion() {
                let status = StatusEntry {
                    definition: companion.definition.clone(),
                    target: definition.name.clone(),
                    key: companion.key,
                };
                add(
                    companion.definition.name.clone(),
                    Entry::Status(Arc::new(status)),
                    companion.definition,
                )?;
            }
            let registered = Registered {
                tool,
                definition: definition.clone(),
            };
            add(
                definition.name.clone(),
                Entry::Tool(Arc::new(registered)),
                definition,
            )?;
        }
        if let Some(name) = timeouts.into_keys().next() {
            return Err(BuildError::UnknownTool(name));
        }
        if !unkeyed.is_empty() && self.approver.is_none() {
            return Err(BuildError::NoApprover(unkeyed));
        }
        Ok(Toolbox {
            inner: Arc::new(Inner {
                entries,
                definitions,
                store: self.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
                state: Arc::new(self.state),
                approver: self.approver,
                stats: Counters::default(),
                tracker: TaskTracker::new(),
                recorder: Arc::default(),
                shutdown_grace: self.shutdown_grace.unwrap_or(DEFAULT_SHUTDOWN_GRACE),
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
            Entry::Tool(registered) => Some(&registered.definition),
            Entry::Status(status) => Some(&status.definition),
        }
    }

    /// The store the toolbox uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Counts of what the toolbox did.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.stats;
        Stats {
            executed: c.executed.get(),
            replayed: c.replayed.get(),
            in_progress: c.in_progress.get(),
            conflicts: c.conflicts.get(),
            timeouts: c.timeouts.get(),
            released: c.released.get(),
            recovered: c.recovered.get(),
            unknown: c.unknown.get(),
        }
    }

    /// Calls a tool by name with the model's arguments.
    ///
    /// Keyed tools reserve their key before the body runs; the body runs in a task of its own,
    /// so when the tool's `timeout` passes — or this future is dropped — the caller stops
    /// waiting but the body goes on and records its outcome.
    ///
    /// # Blocking work
    ///
    /// While a keyed body runs, its lease is renewed from a separate task, so a body that blocks
    /// its thread (a synchronous client, a CPU-heavy step) keeps its key — as long as the
    /// runtime has another thread to renew from. On a current-thread runtime, or a multi-thread
    /// runtime whose every worker is blocked, nothing renews and the lease lapses: another call
    /// may then take the key over. Run blocking work with [`tokio::task::spawn_blocking`] (or
    /// `block_in_place`) inside the body. If a lease is lost anyway, the call does not claim
    /// success: it answers `LEASE_LOST` ("the action may have happened twice") and logs it.
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let inner = &self.inner;
        let registered = match inner.entries.get(name) {
            Some(Entry::Tool(registered)) => registered.clone(),
            Some(Entry::Status(status)) => return self.status(status, args, ctx).await,
            None => return Err(self.unknown_tool(name)),
        };
        let def = &registered.definition;
        let approval_args = (def.story == Story::Unkeyed).then(|| args.clone());
        let call = registered.tool.prepare(args, ctx)?;
        if let Some(arguments) = approval_args {
            let request = ApprovalRequest {
                tool: &def.name,
                arguments: &arguments,
                context: ctx,
            };
            let approved = match &inner.approver {
                Some(approver) => approver.approve(&request).await,
                None => false,
            };
            if !approved {
                return Err(texts::not_approved(&def.name));
            }
        }

        let timeout = def.settings.timeout;
        let story = def.story;
        let task = {
            let inner = self.inner.clone();
            let registered = registered.clone();
            let ctx = ctx.clone();
            self.inner.tracker.spawn(async move {
                if story == Story::Idempotent {
                    exec::run_keyed(inner, registered, call, ctx).await
                } else {
                    inner.stats.executed.inc();
                    let invocation = Invocation {
                        ctx,
                        state: inner.state.clone(),
                    };
                    match AssertUnwindSafe((call.body)(invocation))
                        .catch_unwind()
                        .await
                    {
                        Ok(result) => result.map(|value| ToolOutput {
                            value,
                            replayed: false,
                        }),
                        Err(panic) => Err(panicked(
                            &format!("`{}`", registered.definition.name),
                            "body",
                            panic,
                        )),
                    }
                }
            })
        };
        let joined = match timeout {
            None => task.await,
            Some(limit) => match tokio::time::timeout(limit, task).await {
                Ok(joined) => joined,
                Err(_) => {
                    inner.stats.timeouts.inc();
                    return Err(texts::timed_out(def, limit));
                }
            },
        };
        joined.unwrap_or_else(|e| Err(texts::task_failed(name, &e.to_string())))
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
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.inner.tracker.reopen();
        self.inner.recorder.drain(self.inner.shutdown_grace).await
    }

    async fn status(
        &self,
        status: &StatusEntry,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let key = (status.key)(args, ctx)?;
        let rkey = RecordKey::new(ctx.scope(), key.as_str());
        let record = self
            .inner
            .store
            .get(&rkey)
            .await
            .map_err(texts::store_error)?;
        let time = |t| humantime::format_rfc3339_millis(t).to_string();
        let value = match record {
            None => json!({"status": "not_found"}),
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
        tracing::debug!(tool = %status.definition.name, target = %status.target, key = %key.for_logs(), "status answered");
        Ok(ToolOutput {
            value,
            replayed: false,
        })
    }

    fn unknown_tool(&self, name: &str) -> ToolError {
        self.no_such_tool(texts::unknown_tool(name))
    }

    /// UNKNOWN_TOOL with `message`, suggesting the tools that exist.
    pub(crate) fn no_such_tool(&self, message: String) -> ToolError {
        texts::no_such_tool(message, self.inner.definitions.iter().map(|d| d.name()))
    }
}
