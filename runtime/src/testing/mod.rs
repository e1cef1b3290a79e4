//! Prove a tool retry-safe in one test: the standard failure catalogue, run against your tool
//! with your fake outside system, counting its effects.
//!
//! A key template, its ignored fields and a recover hook are right only if retries, timeouts,
//! lost replies and crashes never make the tool act twice, nor skip an action. A
//! [`RetryCheck`] runs each such failure against one tool and counts the effects in your fake
//! or sandbox system (an invoice ledger, a payment sandbox):
//!
//! | scenario | how it is produced | a retry-safe tool |
//! |---|---|---|
//! | same call again | two calls | 1 effect; the second is a replay of the first |
//! | timeout, retry, status | the tool's record write is held past a 100 ms timeout; a retry and a status call meanwhile | 1 effect; `IN_PROGRESS`, then `completed` and a replay |
//! | model asks again | as the timeout row, but the model asks again as a *new* tool call, at the next step of its run with a new call id (as [`providers::openai::handle_tool_calls`](crate::providers::openai::handle_tool_calls) numbers them), and once more after the body ended | 1 effect; `IN_PROGRESS`, then a replay. A key on the call's place in the run (`<ctx.step>`) gives each new call a key of its own: the row says **CANNOT JUDGE**, never pass |
//! | reworded retry | every `#[arg(ignore)]` field reworded, key fields respelled only as the key normalizes them, and your own rewordings | 1 effect; every retry a replay |
//! | retry, other arguments | one fingerprinted argument changed | 1 effect; `CONFLICT` |
//! | concurrent duplicates | 8 calls at once (record writes held until the duplicates answer) | 1 effect |
//! | record reply lost | the store applies the tool's record write and loses its reply | 1 effect; the outcome replayed and the status `completed` |
//! | store fails at a write | every store write of the call in turn — the tool's reservation, each `ctx.once` step's reservation and record, the tool's record — fails once before it is applied, then (on a fresh store) is applied and loses its reply; the model retries | 1 effect; a retry that finishes, or an honest `OUTCOME_UNKNOWN`. A tool that acted outside its steps, then met a failed step reservation, fails here |
//! | crash before record | the worker dies at the tool's own record write, after the body; its lease lapses; another worker gets the call | 1 effect: the recover hook finds it, or the answer says `OUTCOME_UNKNOWN` |
//! | crash at a step's write | the worker dies at each write of each `ctx.once` step in turn (its reservation, its record), on a fresh store each; its lease lapses; another worker gets the call | at most 1 effect: the retry finishes the work once, or the answer says `OUTCOME_UNKNOWN` |
//! | crash before effect | the worker dies once its key is reserved, before its body runs; its lease lapses; another worker gets the call | the recover hook finds nothing and the retry acts (1 effect), or the answer says `OUTCOME_UNKNOWN` (none); a hook that answers "found" without looking fails |
//! | lease lapses, slow body | the tool's record write is held and the renewals fail until the lease lapses; another worker gets the call | 1 effect; the first call does not claim a second |
//! | another action | your [`other_action`](RetryCheck::other_action) after the first call | 2 effects |
//!
//! Every row also checks the first call alone: one effect, and an answer that says so (an error
//! after the effect that invites a retry frees the key, and the retry acts again).
//!
//! The write boundaries are found by a probe: before the rows, one call runs on a store that
//! notes every write (reservation, record, release, unknown mark, take-over) and whose record
//! it is, the tool's or a step's. The fault rows then stop a fresh call at each of those writes.
//! A worker that dies *before* its own reservation reaches the store has done nothing, so that
//! boundary is left to the store row.
//!
//! A row is **pass**, **FAIL**, **not run** (nothing to try; its reason says what would let it
//! run) or **CANNOT JUDGE**: the kit cannot tell whether the tool is safe there, and
//! [`Report::assert_retry_safe`] fails as it does for a failing row — the kit never calls such a
//! tool safe. A key on `<ctx.step>` is that case: toolkey takes the model's retry for a new
//! action, as it takes a second request, so only the model's obedience to "do not call again"
//! stands between the user and a second effect. The model's retries keep the run id and event
//! id: a key on `<ctx.run_id>` is judged for retries within a run (a run started anew rather
//! than resumed is a new action under it, and the row notes so).
//!
//! Each scenario gets a fresh world (your fake system), a fresh store and fresh toolboxes, built
//! by your closure over the store the check gives it. Leases lapse on a [`ManualClock`] the
//! check moves, so nothing waits for a real lease; the store must judge leases by that clock
//! ([`Backend::memory`] and [`Backend::sqlite`] do).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! use toolkey::{json, tool, State, ToolError};
//! use toolkey::testing::{Backend, RetryCheck, Scenario, Verdict};
//!
//! #[derive(Default)]
//! struct Ledger {
//!     invoices: AtomicUsize,
//! }
//!
//! /// Send the invoice for one customer and month.
//! #[tool(idempotent(key = "invoice:<customer>:<month>"))]
//! async fn send_invoice(
//!     ledger: State<Ledger>,
//!     #[arg(key = "case_insensitive")] customer: String,
//!     month: String,
//!     cents: i64,
//!     #[arg(ignore)] memo: String,
//! ) -> Result<u32, ToolError> {
//!     let _ = (customer, month, cents, memo);
//!     Ok(ledger.invoices.fetch_add(1, Ordering::SeqCst) as u32 + 1)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let args = json!({"customer": "acme", "month": "2026-10", "cents": 12000, "memo": "October"});
//! let report = RetryCheck::new("send_invoice", args, || Arc::new(Ledger::default()))
//!     .toolbox(|builder, ledger| builder.shared_state(ledger.clone()).tool(SendInvoice).build())
//!     .effects(|ledger| ledger.invoices.load(Ordering::SeqCst))
//!     .other_action(json!({"customer": "acme", "month": "2026-11", "cents": 12000, "memo": "November"}))
//!     .store(Backend::sqlite())
//!     .run()
//!     .await;
//! report.assert_retry_safe();
//! // No recover hook: after a crash the model is told the outcome is unknown, one invoice sent.
//! let crash = report.row(Scenario::Crash).unwrap();
//! assert_eq!((crash.observed, crash.verdict), (1, Verdict::Pass));
//! assert!(crash.answer.ends_with("OUTCOME_UNKNOWN, status unknown"));
//! # }
//! ```
//!
//! A failing check panics with the whole table, each failing row saying which scenario did the
//! work twice (or skipped it) and why:
//!
//! ```text
//! retry check of `send_invoice` on the memory store: 9 scenarios FAILED
//!   scenario                 expected  observed  answer                     verdict
//!   same call again                 1         2  ok, then ok                FAIL
//!       FAIL: did the work twice: the same call, made again, ran again; `send_invoice` is `unkeyed`: ...
//! ```

mod report;
mod scenarios;
mod vary;
mod worker;

use std::sync::Arc;

use serde_json::Value;

use crate::store::{ManualClock, MemoryStore, Store};
use crate::{BuildError, ToolContext, Toolbox, ToolboxBuilder};

pub use report::{Report, Row, Scenario, Verdict};

type MakeStore = dyn Fn(Arc<ManualClock>) -> Arc<dyn Store> + Send + Sync;
type MakeToolbox<W> = dyn Fn(ToolboxBuilder, &W) -> Result<Toolbox, BuildError> + Send + Sync;
type CountEffects<W> = dyn Fn(&W) -> usize + Send + Sync;

/// The store a check runs on: a fresh one per scenario, judging leases by the check's clock.
#[derive(Clone)]
pub struct Backend {
    name: String,
    make: Arc<MakeStore>,
}

impl Backend {
    /// A [`MemoryStore`] per scenario.
    pub fn memory() -> Backend {
        Backend::new("memory", |clock| Arc::new(MemoryStore::with_clock(clock)))
    }

    /// An in-memory SQLite database per scenario, through [`SqliteStore`](crate::store::SqliteStore).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite() -> Backend {
        Backend::new("sqlite", |clock| {
            let store = crate::store::SqliteStore::open_in_memory()
                .expect("retry check: an in-memory SQLite database opens");
            Arc::new(store.with_clock(clock))
        })
    }

    /// Another store, named `name` in the report. `make` must return an empty store that
    /// judges leases and retention by the clock it is given; a store on a server's clock cannot
    /// have its leases lapse on cue (the crash and lease rows then fail and say so).
    pub fn new(
        name: impl Into<String>,
        make: impl Fn(Arc<ManualClock>) -> Arc<dyn Store> + Send + Sync + 'static,
    ) -> Backend {
        Backend {
            name: name.into(),
            make: Arc::new(make),
        }
    }

    /// The name the report gives it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).finish()
    }
}

/// The failure catalogue, set up for one tool: see the [module docs](self).
///
/// `W` is your world: the fake outside system the tool acts on, made fresh for each scenario
/// and shared by every toolbox of that scenario (a crashed worker and the one that replaces it
/// act on one ledger).
pub struct RetryCheck<W> {
    tool: String,
    args: Value,
    world: Box<dyn Fn() -> W + Send + Sync>,
    toolbox: Option<Box<MakeToolbox<W>>>,
    effects: Option<Box<CountEffects<W>>>,
    backend: Backend,
    context: ToolContext,
    reworded: Vec<Value>,
    other_action: Option<Value>,
    duplicates: usize,
}

impl<W> RetryCheck<W> {
    /// A check of tool `tool` called with `args` (arguments that make it act), on worlds made
    /// by `world`. Give it [`toolbox`](Self::toolbox) and [`effects`](Self::effects), then
    /// [`run`](Self::run) it.
    pub fn new(
        tool: impl Into<String>,
        args: Value,
        world: impl Fn() -> W + Send + Sync + 'static,
    ) -> RetryCheck<W> {
        RetryCheck {
            tool: tool.into(),
            args,
            world: Box::new(world),
            toolbox: None,
            effects: None,
            backend: Backend::memory(),
            context: ToolContext::new("retry-check")
                .with_step(1)
                .with_tenant("retry-check"),
            reworded: Vec::new(),
            other_action: None,
            duplicates: 8,
        }
    }

    /// Builds one worker's toolbox: `builder` already holds the scenario's store and the
    /// check's timeout for the tool; add the tool and its state (and an approver for an
    /// `unkeyed` tool), then `build()`. Called several times per scenario.
    pub fn toolbox(
        mut self,
        make: impl Fn(ToolboxBuilder, &W) -> Result<Toolbox, BuildError> + Send + Sync + 'static,
    ) -> Self {
        self.toolbox = Some(Box::new(make));
        self
    }

    /// Counts the tool's effects in the world: invoices on the ledger, refunds in the sandbox.
    pub fn effects(mut self, count: impl Fn(&W) -> usize + Send + Sync + 'static) -> Self {
        self.effects = Some(Box::new(count));
        self
    }

    /// The store to run on ([`Backend::memory`] unless set).
    pub fn store(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The context of every call (run `retry-check`, step 1, tenant `retry-check` unless set).
    pub fn context(mut self, ctx: ToolContext) -> Self {
        self.context = ctx;
        self
    }

    /// The same action as the model might write it again (a memo in other words): it must be
    /// answered as a replay. May be given several times.
    pub fn reworded(mut self, args: Value) -> Self {
        self.reworded.push(args);
        self
    }

    /// Another action that must run after the first (the next month's invoice): a key that
    /// leaves out what tells the two apart answers it with a `CONFLICT` or a replay.
    pub fn other_action(mut self, args: Value) -> Self {
        self.other_action = Some(args);
        self
    }

    /// How many concurrent duplicates the concurrency scenario sends (8 unless set, at least 2).
    pub fn duplicates(mut self, n: usize) -> Self {
        self.duplicates = n.max(2);
        self
    }
}

impl<W> std::fmt::Debug for RetryCheck<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryCheck")
            .field("tool", &self.tool)
            .field("args", &self.args)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}
