//! The catalogue itself: each scenario on a fresh world, store and toolboxes, judged by the
//! effects counted and the answers the model got.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::report::{Report, Row, Scenario};
use super::vary::Fields;
use super::worker::{Boundary, Control, WorkerStore};
use super::RetryCheck;
use crate::store::{ManualClock, Store};
use crate::{ErrorCode, Story, ToolContext, ToolDefinition, ToolError, ToolOutput, Toolbox};

// The scenarios by family; this file holds what they share.
mod actions;
mod crashes;
mod retries;
mod store;

/// How long one scenario may take before its row fails.
const SCENARIO_LIMIT: Duration = Duration::from_secs(90);

type Answer = Result<ToolOutput, ToolError>;

/// One scenario's world, clock and store, and the effect count it started from.
struct Scene<W> {
    world: W,
    clock: Arc<ManualClock>,
    store: Arc<dyn Store>,
    before: usize,
    /// What the workers' shutdowns reported unwritten.
    unrecorded: Mutex<Vec<String>>,
}

impl<W> Scene<W> {
    /// Waits for a worker's bodies and writes, and keeps what the store never took.
    async fn drain(&self, toolbox: &Toolbox) {
        let report = toolbox.shutdown().await;
        let mut unrecorded = self.unrecorded.lock().unwrap_or_else(|e| e.into_inner());
        unrecorded.extend(
            report
                .unrecorded
                .iter()
                .map(|u| format!("{} (its {})", u.what, u.write)),
        );
    }
}

/// What every scenario reads: the tool's definition, what it says about the arguments, and the
/// writes a call of it makes to the store.
struct Target<'a> {
    def: &'a ToolDefinition,
    fields: Fields<'a>,
    /// The store-write boundaries of one call, in order, as a probe call made them: the tool's
    /// reservation, each step's reservation and record, the tool's record.
    writes: Vec<Boundary>,
}

impl Target<'_> {
    /// The tool's own record write (its outcome or its unknown mark), if a call makes one.
    fn tool_record(&self) -> Option<&Boundary> {
        self.writes.iter().find(|b| b.is_tool_record())
    }

    /// The key holds the call's place in the run (`<ctx.step>`).
    fn per_call(&self) -> bool {
        self.def.key_follows_step()
    }
}

impl<W> RetryCheck<W> {
    /// Runs every scenario, one after the other, and reports each.
    ///
    /// # Panics
    ///
    /// Without [`toolbox`](Self::toolbox) or [`effects`](Self::effects), when the toolbox
    /// closure fails, or when the toolbox has no tool of the checked name.
    pub async fn run(&self) -> Report {
        assert!(
            self.toolbox.is_some() && self.effects.is_some(),
            "retry check of `{}`: give it .toolbox(..) and .effects(..) before .run()",
            self.tool
        );
        let probe = self.scene();
        let control = Control::new(&self.tool);
        let toolbox = self.controlled(&probe, &control);
        let Some(def) = toolbox.definition(&self.tool).cloned() else {
            let names: Vec<&str> = toolbox.definitions().iter().map(|d| d.name()).collect();
            panic!(
                "retry check: the toolbox has no tool named `{}`; it has {names:?}",
                self.tool
            );
        };
        // One call, watched: the writes each fault scenario then stops a call at, in turn.
        let probed = async {
            let _ = self.call(&toolbox, &self.args).await;
            probe.drain(&toolbox).await;
        };
        let _ = tokio::time::timeout(SCENARIO_LIMIT, probed).await;
        let target = Target {
            def: &def,
            fields: Fields::of(&def),
            writes: control.writes(),
        };
        let mut rows = Vec::new();
        for scenario in Scenario::ALL {
            let row = match tokio::time::timeout(SCENARIO_LIMIT, self.scenario(scenario, &target))
                .await
            {
                Ok(row) => row,
                Err(_) => {
                    let mut row = Row::new(scenario, 1, 0).answer("no answer");
                    row.fail(format!(
                        "the scenario did not end within {} s: a call or a body never returned",
                        SCENARIO_LIMIT.as_secs()
                    ));
                    row
                }
            };
            rows.push(row);
        }
        Report {
            tool: self.tool.clone(),
            store: self.backend.name().to_string(),
            rows,
        }
    }

    async fn scenario(&self, scenario: Scenario, t: &Target<'_>) -> Row {
        let scene = &self.scene();
        let mut row = match scenario {
            Scenario::Replay => self.replay(t, scene).await,
            Scenario::Timeout => self.timeout(t, scene).await,
            Scenario::ModelRetry => self.model_retry(t, scene).await,
            Scenario::Reworded => self.reworded_retries(t, scene).await,
            Scenario::OtherArguments => self.other_arguments(t, scene).await,
            Scenario::Concurrent => self.concurrent(t, scene).await,
            Scenario::LostReply => self.lost_reply(t, scene).await,
            Scenario::StoreFails => self.store_fails(t).await,
            Scenario::Crash => self.crash(t, scene).await,
            Scenario::CrashAtStep => self.crash_at_step(t).await,
            Scenario::CrashBeforeEffect => self.crash_before_effect(t, scene).await,
            Scenario::LeaseLapse => self.lease_lapse(t, scene).await,
            Scenario::OtherAction => self.another_action(t, scene).await,
        };
        let unrecorded =
            std::mem::take(&mut *scene.unrecorded.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(what) = unrecorded.first() {
            row.fail(format!(
                "the store never took the record of {what}: after a restart its outcome reads as unknown"
            ));
        }
        row
    }

    fn scene(&self) -> Scene<W> {
        let world = (self.world)();
        let clock = Arc::new(ManualClock::new());
        let store = (self.backend.make)(clock.clone());
        let before = self.count_raw(&world);
        Scene {
            world,
            clock,
            store,
            before,
            unrecorded: Mutex::default(),
        }
    }

    fn count_raw(&self, world: &W) -> usize {
        (self.effects.as_ref().expect("checked in run"))(world)
    }

    fn effects_in(&self, scene: &Scene<W>) -> usize {
        self.count_raw(&scene.world).saturating_sub(scene.before)
    }

    /// One worker: a toolbox over `store`, the tool's timeout set to `timeout`.
    fn worker(
        &self,
        scene: &Scene<W>,
        store: Arc<dyn Store>,
        timeout: Option<Duration>,
    ) -> Toolbox {
        let builder = Toolbox::builder()
            .shared_store(store)
            .timeout(self.tool.clone(), timeout);
        let make = self.toolbox.as_ref().expect("checked in run");
        make(builder, &scene.world).unwrap_or_else(|e| {
            panic!(
                "retry check of `{}`: the toolbox closure failed: {e}",
                self.tool
            )
        })
    }

    fn controlled(&self, scene: &Scene<W>, control: &Arc<Control>) -> Toolbox {
        let store = WorkerStore {
            inner: scene.store.clone(),
            control: control.clone(),
        };
        self.worker(scene, Arc::new(store), None)
    }

    async fn call(&self, toolbox: &Toolbox, args: &Value) -> Answer {
        toolbox.call(&self.tool, args.clone(), &self.context).await
    }

    /// The model's `n`th retry of the check's call: a new tool call, at the `n`th step after
    /// the first call's in the same run, with a tool call id of its own.
    fn model_call(&self, n: u64) -> ToolContext {
        let step = self.context.step().unwrap_or(0) + n;
        self.context
            .clone()
            .with_step(step)
            .with_tool_call_id(format!("retry-check-{step}"))
    }

    /// The check's call on `toolbox`, in a task of its own (a worker the scenario then kills,
    /// holds up or lets finish).
    fn spawn_call(&self, toolbox: &Toolbox) -> tokio::task::JoinHandle<Answer> {
        let (toolbox, tool) = (toolbox.clone(), self.tool.clone());
        let (args, ctx) = (self.args.clone(), self.context.clone());
        tokio::spawn(async move { toolbox.call(&tool, args, &ctx).await })
    }

    /// The status tool's answer (`completed`, `unknown`, ...), for tools that have one.
    async fn status(&self, toolbox: &Toolbox, def: &ToolDefinition) -> Option<String> {
        let name = def.status_tool()?;
        Some(
            match toolbox.call(name, self.args.clone(), &self.context).await {
                Ok(out) => out.value["status"].as_str().unwrap_or("?").to_string(),
                Err(err) => err.code().to_string(),
            },
        )
    }

    /// The status tool's answer when asked with the key's fields alone, as its schema allows:
    /// the key it derives itself, not the tool's from a whole call.
    async fn status_by_key(&self, toolbox: &Toolbox, t: &Target<'_>) -> Option<(String, String)> {
        let name = t.def.status_tool()?;
        let names = t.def.key_arguments();
        let args: serde_json::Map<String, Value> = self
            .args
            .as_object()?
            .iter()
            .filter(|(k, _)| names.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if args.is_empty() {
            return None;
        }
        let status = match toolbox.call(name, Value::Object(args), &self.context).await {
            Ok(out) => out.value["status"].as_str().unwrap_or("?").to_string(),
            Err(err) => err.code().to_string(),
        };
        Some((ticked(&names), status))
    }
}

/// Moves the scene's clock past the tool's lease: a reservation nobody renewed reads as stale.
fn lapse<W>(t: &Target<'_>, scene: &Scene<W>) {
    let lease = t.def.settings().lease;
    scene.clock.advance(lease + Duration::from_secs(1));
}

/// `ok`, `replayed`, or the error's code.
fn code(answer: &Answer) -> String {
    match answer {
        Ok(out) if out.replayed => "replayed".into(),
        Ok(_) => "ok".into(),
        Err(err) => err.code().into(),
    }
}

/// `1 ok, 7 IN_PROGRESS`.
fn tally<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for answer in answers {
        let code = code(answer);
        match counts.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => counts.push((code, 1)),
        }
    }
    counts
        .iter()
        .map(|(c, n)| format!("{n} {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An answer that tells the model to call again.
fn invites_retry(answer: &Answer) -> bool {
    matches!(answer, Err(err) if err.is_retryable())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn ticked(fields: &[String]) -> String {
    if fields.is_empty() {
        return "nothing".into();
    }
    fields
        .iter()
        .map(|f| format!("`{f}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn panic_answer(err: &tokio::task::JoinError) -> Answer {
    Err(ToolError::internal(format!(
        "the call's task failed: {err}"
    )))
}

/// Why a tool without a key does the work again.
fn no_key(def: &ToolDefinition) -> Option<String> {
    (def.story() != Story::Idempotent).then(|| {
        format!(
            "`{}` is `{}`: no key ties a retry to the first call; declare `idempotent(key = \"...\")`",
            def.name(),
            def.story().as_str()
        )
    })
}

/// Fails the row when the effects are not as expected: more is the work done twice, fewer is
/// work skipped. `keyed_cause` explains the double for a keyed tool.
fn effects_verdict(row: &mut Row, t: &Target<'_>, what: &str, keyed_cause: &str) {
    if row.observed > row.expected {
        let cause = no_key(t.def).unwrap_or_else(|| keyed_cause.to_string());
        let cause = if cause.is_empty() {
            String::new()
        } else {
            format!("; {cause}")
        };
        let times = match row.observed {
            2 => "twice".to_string(),
            n => format!("{n} times"),
        };
        row.fail(format!("did the work {times}: {what}{cause}"));
    } else if row.observed < row.expected {
        row.fail(format!(
            "skipped work: {} effect(s) counted where {} were due",
            row.observed, row.expected
        ));
    }
}

/// The example arguments must make the tool act, once: `acted` effects were counted after the
/// first call.
fn first_acted(row: &mut Row, first: &Answer, acted: usize) {
    if acted > 1 {
        row.fail(format!(
            "the first call alone made {acted} effects: the body acts more than once in one call (a loop, or a retry inside the body that the outside system does not deduplicate)"
        ));
        return;
    }
    let Err(err) = first else {
        return;
    };
    if acted == 1 && err.is_retryable() && !err.is(ErrorCode::OutcomeUnknown) {
        row.fail(format!(
            "the first call acted and answered {} ({}), which invites a retry: such an answer frees the key, so the effect is never recorded and the retry acts again; once the tool may have acted, answer `ToolError::outcome_unknown(..)` or its result",
            err.code(),
            err.message()
        ));
    } else if acted == 1 && !err.is(ErrorCode::OutcomeUnknown) {
        row.fail(format!(
            "the first call acted and answered {} ({}): the model is told the call failed, though it acted",
            err.code(),
            err.message()
        ));
    } else {
        row.fail(format!(
            "the first call answered {} ({}): give arguments that make the tool act",
            err.code(),
            err.message()
        ));
    }
}

/// A later call must be the first call's result, replayed.
fn same_result(row: &mut Row, first: &Answer, again: &Answer, what: &str) {
    let (Ok(first), Ok(again)) = (first, again) else {
        if let (Ok(_), Err(err)) = (first, again) {
            row.fail(format!(
                "{what} answered {} ({}), not the first result",
                err.code(),
                err.message()
            ));
        }
        return;
    };
    if !again.replayed {
        row.fail(format!("{what} was not answered as a replay"));
    } else if again.value != first.value {
        row.fail(format!(
            "{what} was answered {} where the first call answered {}",
            again.value, first.value
        ));
    }
}
