//! Retry limits and concurrency limits: what the executor keeps to stop a model that repeats a
//! failing call, and to bound how many bodies of one tool run at once.
//!
//! A keyed call's failures are counted in the store, under its record key, so every process
//! sharing the store shares the count; the keyed path counts and checks them while it holds the
//! key, so no other process runs the call in between. A key on the call's place in the run is
//! new at every call: such a call is counted under [`by_call`], what the model's retry repeats
//! (calls at two places run side by side, so each checks the count as it starts). A failure
//! after a `ctx.once` step finished is noted beside the count ([`steps_mark`]), so that every
//! refusal, made in any process, says that part of the action was done. A call without a key
//! is counted here, in this process's memory, by its tenant, tool and the fingerprint of its
//! arguments as the tool reads them: a [`Tally`] settles it once, at the caller's timeout or
//! at the body's end, whichever answers.
//!
//! A tool's concurrency limit is a semaphore in this process: a [`Slot`] waits for one of its
//! permits until the call's deadline, and tells the caller, when its timeout passes, whether the
//! body never got one (then the answer is `BUSY`, and the body never runs).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::fingerprint::{canonical_fields, canonical_json};
use crate::store::RecordKey;
use crate::tool::DEFAULT_RETRY_LIMIT;
use crate::{
    texts, ErrorCode, Fingerprint, IdempotencyKey, ToolContext, ToolDefinition, ToolError,
};

/// How many calls without a key this process keeps failure counts for. Past it, counts whose
/// window ended are dropped first, then the ones whose window ends soonest.
const MAX_UNKEYED_COUNTS: usize = 10_000;

/// A retry limit in force: `failures` within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) failures: u64,
    pub(crate) window: Duration,
}

impl Limit {
    /// The limit of `def`'s tool, unless it is off. A definition built outside a toolbox (whose
    /// limit is still "the toolbox's") gets the built-in default.
    pub(crate) fn of(def: &ToolDefinition) -> Option<Limit> {
        let limit = def.settings.retry_limit.or(DEFAULT_RETRY_LIMIT);
        Some(Limit {
            failures: u64::from(limit.failures()?),
            window: limit.window()?,
        })
    }

    /// `RETRY_LIMIT` for a call of `def`'s tool after `failures` (counted by its key, for a
    /// keyed tool); `last`: the code this call failed with.
    pub(crate) fn reached(
        &self,
        def: &ToolDefinition,
        failures: u64,
        last: Option<&str>,
    ) -> ToolError {
        // A key on the call's place in the run is counted by the call, as a call without one.
        let by_key = def.story == crate::Story::Idempotent && !def.key_follows_step();
        texts::retry_limit(&def.name, by_key, failures, self.window, last)
    }

    /// [`reached`](Self::reached) for a keyed call whose record is kept unknown: the action may
    /// have happened, and the answer says so.
    pub(crate) fn reached_unknown(
        &self,
        def: &ToolDefinition,
        failures: u64,
        last: Option<&str>,
    ) -> ToolError {
        texts::retry_limit_unknown(def.named(), failures, self.window, last)
    }
}

/// Where the failures of a call keyed on its place in the run are counted: in its tenant,
/// under `limit_key` (its key at one fixed place), its fingerprint and its run, what the
/// model's retry repeats. No tool's key holds an unescaped `>`, and no step's name a `*`, so no
/// record's counter is this one.
pub(crate) fn by_call(
    ctx: &ToolContext,
    limit_key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> RecordKey {
    let mut call = Sha256::new();
    call.update(fingerprint.to_hex());
    call.update(ctx.run_id());
    let call = hex::encode(call.finalize());
    RecordKey::new(ctx.scope(), format!("{}>*calls:{call}", limit_key.as_str()))
}

/// The counter beside `counted`'s that notes a failure of the call after one of its steps
/// finished, so that a refusal made later, maybe in another process, can say that part of the
/// action was done. No step's name holds a `*`, so no record's counter is this one.
pub(crate) fn steps_mark(counted: &RecordKey) -> RecordKey {
    RecordKey::new(counted.tenant.clone(), format!("{}>*steps", counted.key))
}

/// True when `err`, the answer to a call whose body ran, counts against the retry limit: it
/// invites a retry, and is not about the store or the concurrency limit (nothing of the tool's
/// failed there, and an outage must not use up every call's allowance).
pub(crate) fn counts_as_failure(err: &ToolError) -> bool {
    err.is_retryable() && !err.is(ErrorCode::StoreUnavailable) && !err.is(ErrorCode::Busy)
}

/// What the executor keeps for every tool: the concurrency limits' semaphores, and the failure
/// counts of calls without a key.
#[derive(Default)]
pub(crate) struct Limits {
    slots: HashMap<String, (Arc<Semaphore>, usize)>,
    unkeyed: Mutex<UnkeyedCounts>,
}

impl Limits {
    /// Bounds `tool` to `limit` bodies at once in this process.
    pub(crate) fn limit_concurrency(&mut self, tool: &str, limit: NonZeroUsize) {
        let limit = limit.get().min(Semaphore::MAX_PERMITS);
        self.slots
            .insert(tool.to_string(), (Arc::new(Semaphore::new(limit)), limit));
    }

    /// A slot to wait for, if `tool` has a concurrency limit; the wait ends at `deadline`.
    pub(crate) fn slot(&self, tool: &str, timeout: Option<Duration>) -> Option<Arc<Slot>> {
        let (semaphore, size) = self.slots.get(tool)?;
        Some(Arc::new(Slot {
            semaphore: semaphore.clone(),
            size: *size,
            deadline: timeout.map(|t| Instant::now() + t),
            waited: timeout.unwrap_or_default(),
            state: AtomicU8::new(IDLE),
        }))
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, UnkeyedCounts> {
        self.unkeyed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `RETRY_LIMIT` if the call `tally` counts, of `def`'s tool in `ctx`'s tenant, failed as
    /// often as its limit allows. A tool none of whose calls has a failure counted is not asked
    /// for its call's hash.
    pub(crate) fn refuse_if_reached(
        &self,
        def: &ToolDefinition,
        ctx: &ToolContext,
        tally: &Tally,
    ) -> Result<(), ToolError> {
        let Some(limit) = tally.limit else {
            return Ok(());
        };
        if !self.counts().has(&tally.tool) {
            return Ok(());
        }
        let call = tally.call(def, ctx);
        let failures = self.counts().failures(&call);
        if failures >= limit.failures {
            tracing::warn!(tool = %def.name, fingerprint = %call.short(), failures, "retry limit reached: the call was refused without running");
            return Err(limit.reached(def, failures, None));
        }
        Ok(())
    }
}

/// One call without a key, as retry limits count it: its tenant, its tool and its arguments
/// as the tool receives them (read into its types, defaults applied, `#[arg(ignore)]` fields
/// left out, fingerprinted), hashed to 128 bits under keys drawn at random once per process:
/// nobody who does not know the keys can make two calls share a count. A call is hashed only
/// when its count is read or written, never on the way of a call of a tool with none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct UnkeyedCall(u64, u64);

impl UnkeyedCall {
    /// The call of `def`'s tool with `args` in `ctx`'s tenant: by the fingerprint of its
    /// arguments read into the tool's types, so a default spelled out, field order or number
    /// spelling do not make another call. A tool that cannot read them so (a definition written
    /// by hand) has them written in the canonical form a fingerprint hashes (fields sorted,
    /// `5.0` as `5`), into a buffer this thread keeps.
    pub(crate) fn new(def: &ToolDefinition, args: &Value, ctx: &ToolContext) -> Self {
        static KEYS: OnceLock<(RandomState, RandomState)> = OnceLock::new();
        thread_local! {
            static CANONICAL: RefCell<String> = const { RefCell::new(String::new()) };
        }
        let keys = KEYS.get_or_init(|| (RandomState::new(), RandomState::new()));
        // The arguments were read once already, to run the call: they read again.
        if let Some(fingerprint) = def.arguments_fingerprint.and_then(|read| read(args)) {
            let call = (ctx.scope(), def.name.as_str(), fingerprint);
            return UnkeyedCall(keys.0.hash_one(call), keys.1.hash_one(call));
        }
        let ignored = &def.ignored_arguments;
        CANONICAL.with_borrow_mut(|text| {
            text.clear();
            match args {
                Value::Object(map) => canonical_fields(
                    map.iter().filter(|(k, _)| !ignored.iter().any(|i| i == *k)),
                    text,
                ),
                other => canonical_json(other, text),
            }
            let call = (ctx.scope(), def.name.as_str(), text.as_str());
            let call = UnkeyedCall(keys.0.hash_one(call), keys.1.hash_one(call));
            // A buffer grown by one huge call is not kept.
            if text.capacity() > 64 * 1024 {
                *text = String::new();
            }
            call
        })
    }

    /// The hash's first hex digits, for logs.
    fn short(&self) -> String {
        format!("{:012x}", self.0 >> 16)
    }
}

/// The failure counts of calls without a key: each call's count, when its window ends and its
/// tool; and how many calls of each tool have a count, so a tool with none skips the hash.
#[derive(Default)]
struct UnkeyedCounts {
    counts: HashMap<UnkeyedCall, Count>,
    tools: HashMap<Arc<str>, usize>,
}

struct Count {
    failures: u64,
    ends: Instant,
    tool: Arc<str>,
}

impl UnkeyedCounts {
    /// True when some call of `tool` has a count (whose window may have ended).
    fn has(&self, tool: &str) -> bool {
        !self.tools.is_empty() && self.tools.contains_key(tool)
    }

    fn failures(&self, call: &UnkeyedCall) -> u64 {
        if self.counts.is_empty() {
            return 0;
        }
        match self.counts.get(call) {
            Some(count) if count.ends > Instant::now() => count.failures,
            _ => 0,
        }
    }

    /// One more failure of `call`, a call of `tool`; its count in the window.
    fn count(&mut self, call: &UnkeyedCall, tool: &Arc<str>, window: Duration) -> u64 {
        let now = Instant::now();
        if !self.counts.contains_key(call) && self.counts.len() >= MAX_UNKEYED_COUNTS {
            let ended: Vec<UnkeyedCall> = self
                .counts
                .iter()
                .filter(|(_, count)| count.ends <= now)
                .map(|(call, _)| *call)
                .collect();
            for call in &ended {
                self.remove(call);
            }
            if self.counts.len() >= MAX_UNKEYED_COUNTS {
                let soonest = self
                    .counts
                    .iter()
                    .min_by_key(|(_, count)| count.ends)
                    .map(|(call, _)| *call);
                if let Some(soonest) = soonest {
                    self.remove(&soonest);
                }
            }
        }
        let count = match self.counts.entry(*call) {
            std::collections::hash_map::Entry::Occupied(held) => held.into_mut(),
            std::collections::hash_map::Entry::Vacant(place) => {
                *self.tools.entry(tool.clone()).or_default() += 1;
                place.insert(Count {
                    failures: 0,
                    ends: now,
                    tool: tool.clone(),
                })
            }
        };
        if count.ends <= now {
            count.failures = 0;
            count.ends = now + window;
        }
        count.failures += 1;
        count.failures
    }

    fn clear(&mut self, call: &UnkeyedCall) {
        if !self.counts.is_empty() {
            self.remove(call);
        }
    }

    fn remove(&mut self, call: &UnkeyedCall) {
        let Some(count) = self.counts.remove(call) else {
            return;
        };
        if let std::collections::hash_map::Entry::Occupied(mut calls) = self.tools.entry(count.tool)
        {
            *calls.get_mut() -= 1;
            if *calls.get() == 0 {
                calls.remove();
            }
        }
    }
}

/// Settles one call without a key against its retry limit (if its tool has one), once: the
/// caller when its timeout passes, or the body when it ends, whichever answers the model first.
///
/// It keeps the call's arguments and hashes them only when a count is read or written: a call
/// that succeeds while no call of its tool has a failure counted is never hashed.
pub(crate) struct Tally {
    tool: Arc<str>,
    args: Value,
    call: OnceLock<UnkeyedCall>,
    limit: Option<Limit>,
    answered: AtomicBool,
}

impl Tally {
    /// A tally of the call of `tool` with `args` under `limit` (`None`: the limit is off, and
    /// the tally only keeps the arguments).
    pub(crate) fn new(tool: Arc<str>, args: Value, limit: Option<Limit>) -> Tally {
        Tally {
            tool,
            args,
            call: OnceLock::new(),
            limit,
            answered: AtomicBool::new(false),
        }
    }

    /// The call's arguments, as the model sent them.
    pub(crate) fn args(&self) -> &Value {
        &self.args
    }

    /// The call as its count is kept, hashed the first time it is asked for.
    fn call(&self, def: &ToolDefinition, ctx: &ToolContext) -> UnkeyedCall {
        *self
            .call
            .get_or_init(|| UnkeyedCall::new(def, &self.args, ctx))
    }

    /// Counts `answer` to the call of `def`'s tool in `ctx`, if the model reads it, and hands it
    /// back as the model is told it. Only the first side to answer counts (the model reads
    /// nothing else): a timed-out call counts once, as a timeout, and its body's later ending
    /// neither adds a failure nor clears the count. A success clears the count; the failure that
    /// reaches the limit is answered `RETRY_LIMIT`.
    pub(crate) fn settle<T>(
        &self,
        limits: &Limits,
        def: &ToolDefinition,
        ctx: &ToolContext,
        answer: Result<T, ToolError>,
    ) -> Result<T, ToolError> {
        let Some(limit) = self.limit else {
            return answer;
        };
        if self.answered.swap(true, Ordering::SeqCst) {
            return answer;
        }
        match answer {
            Ok(value) => {
                if limits.counts().has(&self.tool) {
                    let call = self.call(def, ctx);
                    limits.counts().clear(&call);
                }
                Ok(value)
            }
            Err(err) if counts_as_failure(&err) => {
                let call = self.call(def, ctx);
                let failures = limits.counts().count(&call, &self.tool, limit.window);
                if failures < limit.failures {
                    return Err(err);
                }
                tracing::warn!(tool = %def.name, fingerprint = %call.short(), failures, code = %err.code(), "retry limit reached: the model is told to stop");
                Err(limit.reached(def, failures, Some(err.code())))
            }
            Err(err) => Err(err),
        }
    }
}

const IDLE: u8 = 0;
const WAITING: u8 = 1;
const STARTED: u8 = 2;
const GAVE_UP: u8 = 3;

/// One call's wait for a slot under its tool's concurrency limit.
pub(crate) struct Slot {
    semaphore: Arc<Semaphore>,
    size: usize,
    deadline: Option<Instant>,
    waited: Duration,
    state: AtomicU8,
}

impl Slot {
    /// Waits for a slot until the call's deadline (forever without one). `Err`: no slot came in
    /// time, or the caller gave up first, and the body must not run; `Err(true)` when this wait
    /// gave up first (the caller did not count the call as busy).
    pub(crate) async fn acquire(&self) -> Result<OwnedSemaphorePermit, bool> {
        let _ = self
            .state
            .compare_exchange(IDLE, WAITING, Ordering::SeqCst, Ordering::SeqCst);
        let wait = self.semaphore.clone().acquire_owned();
        // A deadline already passed still takes a free slot: the timeout polls the wait first.
        let permit = match self.deadline {
            None => wait.await.ok(),
            Some(deadline) => tokio::time::timeout_at(deadline, wait)
                .await
                .ok()
                .and_then(Result::ok),
        };
        if let Some(permit) = permit {
            if self
                .state
                .compare_exchange(WAITING, STARTED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Ok(permit);
            }
        }
        Err(self.state.swap(GAVE_UP, Ordering::SeqCst) != GAVE_UP)
    }

    /// At the caller, when its timeout passed: `Some` when the call was waiting for a slot and
    /// got none (it never will now), so its answer is `BUSY`, not `TIMEOUT`; `Some(true)` when
    /// the caller gave up first (the wait did not count the call as busy).
    pub(crate) fn give_up(&self) -> Option<bool> {
        match self
            .state
            .compare_exchange(WAITING, GAVE_UP, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => Some(true),
            Err(GAVE_UP) => Some(false),
            Err(_) => None,
        }
    }

    /// `BUSY` for `tool`.
    pub(crate) fn busy(&self, tool: &str) -> ToolError {
        texts::busy(tool, self.size, self.waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(n: u64) -> UnkeyedCall {
        let def = ToolDefinition::new("peek", "", json!({}), crate::Story::ReadOnly);
        UnkeyedCall::new(&def, &json!({ "n": n }), &ToolContext::new("run"))
    }

    #[tokio::test(start_paused = true)]
    async fn memory_counts_are_bounded_and_end_with_their_window() {
        let mut counts = UnkeyedCounts::default();
        let window = Duration::from_secs(60);
        let peek: Arc<str> = "peek".into();
        assert!(!counts.has("peek"));
        assert_eq!(counts.count(&call(0), &peek, window), 1);
        assert_eq!(counts.count(&call(0), &peek, window), 2);
        assert!(counts.has("peek"));
        assert!(!counts.has("find"));
        tokio::time::advance(Duration::from_secs(30)).await;
        for n in 1..MAX_UNKEYED_COUNTS as u64 {
            counts.count(&call(n), &peek, window);
        }
        assert_eq!(counts.counts.len(), MAX_UNKEYED_COUNTS);
        // Full: a new call drops the count whose window ends soonest (the first one's).
        counts.count(&call(u64::MAX), &peek, window);
        assert_eq!(counts.counts.len(), MAX_UNKEYED_COUNTS);
        assert_eq!(counts.tools["peek"], MAX_UNKEYED_COUNTS);
        assert_eq!(counts.failures(&call(0)), 0);
        assert_eq!(counts.failures(&call(1)), 1);
        // Once every window ended, a new call sweeps them all.
        tokio::time::advance(window).await;
        assert_eq!(counts.failures(&call(1)), 0);
        let find: Arc<str> = "find".into();
        assert_eq!(counts.count(&call(u64::MAX - 1), &find, window), 1);
        assert_eq!(counts.counts.len(), 1);
        // The swept tool has no count left, so its calls are not hashed until one fails.
        assert!(!counts.has("peek"));
        assert!(counts.has("find"));
        counts.clear(&call(u64::MAX - 1));
        assert!(counts.tools.is_empty());
    }

    #[test]
    fn ignored_arguments_do_not_make_another_call() {
        let def = ToolDefinition::new("search", "", json!({}), crate::Story::ReadOnly)
            .with_ignored_argument("why");
        let ctx = ToolContext::new("run").with_tenant("acme");
        let a = UnkeyedCall::new(&def, &json!({"q": "x", "why": "first"}), &ctx);
        let b = UnkeyedCall::new(&def, &json!({"why": "reworded", "q": "x"}), &ctx);
        let c = UnkeyedCall::new(&def, &json!({"q": "y", "why": "first"}), &ctx);
        let other_tenant = ToolContext::new("run").with_tenant("globex");
        let d = UnkeyedCall::new(&def, &json!({"q": "x"}), &other_tenant);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    /// What makes two calls one, as a fingerprint reads them: field order at any depth and the
    /// spelling of an integral number do not; a value's type, nesting and a field's name do.
    #[test]
    fn calls_are_one_as_their_fingerprints_are() {
        let def = ToolDefinition::new("search", "", json!({}), crate::Story::ReadOnly);
        let ctx = ToolContext::new("run");
        let call = |args: Value| UnkeyedCall::new(&def, &args, &ctx);
        let base = call(json!({"q": "x", "n": 5, "f": {"a": [1, -0.0], "b": null}}));
        assert_eq!(
            base,
            call(json!({"f": {"b": null, "a": [1.0, 0]}, "n": 5.0, "q": "x"}))
        );
        for other in [
            json!({"q": "x", "n": "5", "f": {"a": [1, 0], "b": null}}),
            json!({"q": "x", "n": 5.5, "f": {"a": [1, 0], "b": null}}),
            json!({"q": "x", "n": 5, "f": {"a": [0, 1], "b": null}}),
            json!({"q": "x", "n": 5, "f": {"a": [1, 0], "c": null}}),
            json!({"q": "x", "n": 5, "f": {"a": [1, 0]}, "b": null}),
            json!({"q": "x", "n": 5, "f": {"a": [1, 0], "b": false}}),
            json!({"q": "x", "n": 5}),
        ] {
            assert_ne!(base, call(other.clone()), "{other}");
        }
        let other_tool = ToolDefinition::new("find", "", json!({}), crate::Story::ReadOnly);
        assert_ne!(
            base,
            UnkeyedCall::new(
                &other_tool,
                &json!({"q": "x", "n": 5, "f": {"a": [1, 0], "b": null}}),
                &ctx
            )
        );
    }
}
