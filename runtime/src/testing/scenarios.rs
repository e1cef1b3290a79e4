//! The catalogue itself: each scenario on a fresh world, store and toolboxes, judged by the
//! effects counted and the answers the model got.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinSet;

use super::report::{Report, Row, Scenario, Verdict};
use super::vary::{changed_fields, Fields};
use super::worker::{Action, Boundary, Control, Holder, WorkerStore, WriteOp};
use super::RetryCheck;
use crate::store::{ManualClock, Store};
use crate::{ErrorCode, Story, ToolContext, ToolDefinition, ToolError, ToolOutput, Toolbox};

/// The timeout of the timeout scenario; its record write is held until the retries answered.
const TIMEOUT: Duration = Duration::from_millis(100);
/// How long the concurrency scenario waits for the duplicates before it lets the first finish.
const DUPLICATES_WAIT: Duration = Duration::from_secs(2);
/// How long a body may take to reach its record write.
const BODY_LIMIT: Duration = Duration::from_secs(30);
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

/// A worker killed at one write, and the next worker's retry once its lease lapsed.
struct Crashed {
    retry: Answer,
    status: Option<String>,
    /// The retry asked the recover hook.
    recovered: bool,
    effects: usize,
}

/// A call the store failed once at one write, and the model's retry.
struct Faulted {
    at: Boundary,
    action: Action,
    first: Answer,
    /// The tool's key was free after the first call: its record was released.
    freed: bool,
    retry: Answer,
    effects: usize,
    /// A write the store never took.
    unrecorded: Option<String>,
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

    async fn replay(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let w = self.worker(scene, scene.store.clone(), None);
        let first = self.call(&w, &self.args).await;
        let acted = self.effects_in(scene);
        let again = self.call(&w, &self.args).await;
        scene.drain(&w).await;
        let mut row = Row::new(Scenario::Replay, 1, self.effects_in(scene)).answer(format!(
            "{}, then {}",
            code(&first),
            code(&again)
        ));
        first_acted(&mut row, &first, acted);
        effects_verdict(
            &mut row,
            t,
            "the same call, made again, ran again",
            "the first call's key was not found by the second",
        );
        same_result(&mut row, &first, &again, "the same call, made again,");
        row
    }

    async fn timeout(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let control = Control::new(&self.tool);
        control.hold_records(true);
        let store = WorkerStore {
            inner: scene.store.clone(),
            control: control.clone(),
        };
        let w = self.worker(scene, Arc::new(store), Some(TIMEOUT));
        let first = self.call(&w, &self.args).await;
        let retry = self.call(&w, &self.args).await;
        let status_running = self.status(&w, t.def).await;
        control.hold_records(false);
        scene.drain(&w).await;
        let status_done = self.status(&w, t.def).await;
        let by_key = self.status_by_key(&w, t).await;
        let last = self.call(&w, &self.args).await;
        scene.drain(&w).await;
        let mut answer = format!("{}, retry {}", code(&first), code(&retry));
        if let (Some(running), Some(done)) = (&status_running, &status_done) {
            answer.push_str(&format!(
                ", status {running}; after the body: status {done}"
            ));
        } else {
            answer.push_str("; after the body:");
        }
        let sep = if status_done.is_some() { ", " } else { " " };
        answer.push_str(&format!("{sep}retry {}", code(&last)));
        let mut row = Row::new(Scenario::Timeout, 1, self.effects_in(scene)).answer(answer);
        let retried_after = match &first {
            Err(e) if e.is(ErrorCode::Timeout) => {
                if !e.is_retryable() {
                    "the retry after a TIMEOUT that said not to repeat it (models and clients repeat it anyway)"
                } else {
                    "the retry after the TIMEOUT"
                }
            }
            _ => "the retry (the first call answered before the timeout)",
        };
        effects_verdict(
            &mut row,
            t,
            &format!("{retried_after} ran the body again"),
            "the running call's reservation did not stop the retry",
        );
        if status_done.as_deref().is_some_and(|s| s != "completed") {
            row.fail(format!(
                "the status tool answered `{}` after the body ended, not `completed`: the model cannot learn the outcome",
                status_done.unwrap_or_default()
            ));
        }
        if let Some((fields, status)) = by_key.filter(|(_, s)| s != "completed") {
            row.fail(format!(
                "the status tool, asked with the key's fields alone ({fields}), answered `{status}` after the body ended, not `completed`: it reads another key than the tool's"
            ));
        }
        if !matches!(&last, Ok(out) if out.replayed) && row.observed == 1 {
            row.fail(format!(
                "a retry after the body ended answered {} instead of replaying its outcome",
                code(&last)
            ));
        }
        row
    }

    /// The model's own retry after a timeout: a new tool call at the next step of the run, and
    /// once the body ended another.
    async fn model_retry(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let control = Control::new(&self.tool);
        control.hold_records(true);
        let store = WorkerStore {
            inner: scene.store.clone(),
            control: control.clone(),
        };
        let w = self.worker(scene, Arc::new(store), Some(TIMEOUT));
        let first = self.call(&w, &self.args).await;
        let (asks, again) = (self.model_call(1), self.model_call(2));
        let retry = w.call(&self.tool, self.args.clone(), &asks).await;
        control.hold_records(false);
        scene.drain(&w).await;
        let last = w.call(&self.tool, self.args.clone(), &again).await;
        scene.drain(&w).await;
        let step = |ctx: &ToolContext| ctx.step().unwrap_or_default();
        let mut row = Row::new(Scenario::ModelRetry, 1, self.effects_in(scene)).answer(format!(
            "{}; the model asks again (step {}): {}; after the body (step {}): {}",
            code(&first),
            step(&asks),
            code(&retry),
            step(&again),
            code(&last)
        ));
        let template = t.fields.template().unwrap_or_default();
        let invited = invites_retry(&first) || invites_retry(&retry);
        if t.per_call() && !invited {
            let times = row.observed;
            row.cannot_judge(if times > row.expected {
                format!(
                    "the model asked again as a new tool call (step {}), and the key `{template}` holds `<ctx.step>`, so toolkey took each new call for a new action: the tool acted {times} times. Under such a key the model's retry and a second request are one to toolkey, and its answers tell the model not to call again, which a model may not heed; key the tool on what names the action (an order, an invoice number) for this check to judge it",
                    step(&asks)
                )
            } else {
                format!(
                    "the key `{template}` holds `<ctx.step>`: toolkey gave the model's retry a key of its own, and only the tool's own check kept it from acting again, which this check cannot judge under crashes and concurrent retries; key the tool on what names the action for this check to judge it"
                )
            });
            return row;
        }
        let invitation = if invited {
            ", as the answer invited,"
        } else {
            ""
        };
        effects_verdict(
            &mut row,
            t,
            &format!(
                "the model's retry, a new tool call at step {}{invitation} ran again",
                step(&asks)
            ),
            if t.per_call() {
                "the key holds `<ctx.step>`, so the model's retry got a key of its own, and an answer invited it"
            } else {
                "the retry got the first call's key, and was not answered from its record"
            },
        );
        if !matches!(&last, Ok(out) if out.replayed) && row.observed == 1 {
            row.fail(format!(
                "the model's retry after the body ended answered {} instead of replaying its outcome",
                code(&last)
            ));
        }
        if template.contains("<ctx.run_id>") {
            row.note("the model's retry keeps its run: a call in another run (a run started anew rather than resumed) is a new action under this key, and was not tried");
        } else if template.contains("<ctx.event_id>") {
            row.note("the model's retry keeps its event: every delivery of one event must carry one `ctx.event_id`, or it is a new action under this key");
        }
        row
    }

    async fn reworded_retries(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let mut retries = t.fields.rewordings(&self.args);
        for args in &self.reworded {
            let changed = changed_fields(&self.args, args);
            retries.push(super::vary::Variation {
                label: format!("your rewording ({})", ticked(&changed)),
                args: args.clone(),
            });
        }
        if retries.is_empty() {
            return Row::not_run(
                Scenario::Reworded,
                "nothing to reword: no `#[arg(ignore)]` argument, no text key argument, and no .reworded(..) example",
            );
        }
        let w = self.worker(scene, scene.store.clone(), None);
        let first = self.call(&w, &self.args).await;
        let acted = self.effects_in(scene);
        let mut answers = Vec::new();
        for retry in &retries {
            answers.push(self.call(&w, &retry.args).await);
        }
        scene.drain(&w).await;
        let codes: Vec<String> = answers.iter().map(code).collect();
        let answer = if codes.iter().all(|c| *c == codes[0]) {
            let retries = if codes.len() == 1 { "retry" } else { "retries" };
            format!(
                "{}, then {} {retries}: {}",
                code(&first),
                codes.len(),
                codes[0]
            )
        } else {
            format!("{}, then {}", code(&first), codes.join(", "))
        };
        let mut row = Row::new(Scenario::Reworded, 1, self.effects_in(scene)).answer(answer);
        first_acted(&mut row, &first, acted);
        for (retry, answer) in retries.iter().zip(&answers) {
            let changed = changed_fields(&self.args, &retry.args);
            let in_key: Vec<String> = changed
                .iter()
                .filter(|f| {
                    t.fields
                        .template()
                        .is_some_and(|k| k.contains(&format!("<{f}>")))
                })
                .cloned()
                .collect();
            match answer {
                Ok(out) if out.replayed => continue,
                Ok(_) => {
                    let cause = match (t.def.story(), in_key.is_empty()) {
                        (Story::Idempotent, false) => format!(
                            "the key `{}` holds {}, which the retry wrote otherwise, so it got a new key; keep free text out of the key and mark it `#[arg(ignore)]`",
                            t.fields.template().unwrap_or_default(),
                            ticked(&in_key)
                        ),
                        _ => String::new(),
                    };
                    let what = format!("the retry with {} ran again", retry.label);
                    effects_verdict(&mut row, t, &what, &cause);
                    row.fail(format!(
                        "{what} instead of replaying (the outside system saw no second effect)"
                    ));
                }
                Err(err) if err.is(ErrorCode::Conflict) => row.fail(format!(
                    "the retry with {} was refused as a CONFLICT: {} reach the fingerprint; mark free text `#[arg(ignore)]`",
                    retry.label,
                    ticked(&changed)
                )),
                Err(err) => row.fail(format!(
                    "the retry with {} answered {} ({}), not a replay",
                    retry.label,
                    err.code(),
                    err.message()
                )),
            }
        }
        effects_verdict(&mut row, t, "a reworded retry ran again", "");
        row
    }

    async fn other_arguments(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let Some(retry) = t.fields.other_arguments(&self.args) else {
            let why = if t.fields.has_fingerprinted(&self.args) {
                "no argument outside the key and the ignored ones holds a value this check can change: no other arguments under the key were tried"
            } else {
                "every argument is a key field or ignored: no other arguments can share the key"
            };
            return Row::not_run(Scenario::OtherArguments, why);
        };
        let w = self.worker(scene, scene.store.clone(), None);
        let first = self.call(&w, &self.args).await;
        let acted = self.effects_in(scene);
        let again = self.call(&w, &retry.args).await;
        scene.drain(&w).await;
        let mut row = Row::new(Scenario::OtherArguments, 1, self.effects_in(scene))
            .answer(format!("{}, then {}", code(&first), code(&again)));
        first_acted(&mut row, &first, acted);
        effects_verdict(
            &mut row,
            t,
            &format!(
                "a retry with {} ran as a new action instead of a CONFLICT",
                retry.label
            ),
            "",
        );
        match &again {
            Err(err) if err.is(ErrorCode::Conflict) => {}
            Ok(out) if out.replayed => row.fail(format!(
                "a retry with {} was answered with the first call's result: the model believes the changed action was done; the field must reach the fingerprint",
                retry.label
            )),
            other => row.fail(format!(
                "a retry with {} answered {}, not a CONFLICT",
                retry.label,
                code(other)
            )),
        }
        row
    }

    async fn concurrent(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let control = Control::new(&self.tool);
        control.hold_records(true);
        let w = self.controlled(scene, &control);
        let mut calls = JoinSet::new();
        for _ in 0..self.duplicates {
            let (w, tool, args, ctx) = (
                w.clone(),
                self.tool.clone(),
                self.args.clone(),
                self.context.clone(),
            );
            calls.spawn(async move { w.call(&tool, args, &ctx).await });
        }
        let mut answers = Vec::new();
        let deadline = tokio::time::Instant::now() + DUPLICATES_WAIT;
        while answers.len() + 1 < self.duplicates {
            match tokio::time::timeout_at(deadline, calls.join_next()).await {
                Ok(Some(joined)) => answers.push(joined.unwrap_or_else(|e| panic_answer(&e))),
                Ok(None) | Err(_) => break,
            }
        }
        control.hold_records(false);
        while let Some(joined) = calls.join_next().await {
            answers.push(joined.unwrap_or_else(|e| panic_answer(&e)));
        }
        scene.drain(&w).await;
        let mut row =
            Row::new(Scenario::Concurrent, 1, self.effects_in(scene)).answer(tally(&answers));
        let ran = answers
            .iter()
            .filter(|a| matches!(a, Ok(out) if !out.replayed))
            .count();
        effects_verdict(
            &mut row,
            t,
            &format!("{ran} of {} concurrent duplicates ran", self.duplicates),
            "the store let two calls hold one key",
        );
        row
    }

    async fn lost_reply(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        // The tool's own record: a step's record lost first would test the step, not the call.
        let control = Control::new(&self.tool);
        if let Some(record) = t.tool_record() {
            control.fault(record.clone(), Action::LoseReply);
        }
        let w = self.controlled(scene, &control);
        let first = self.call(&w, &self.args).await;
        let acted = self.effects_in(scene);
        scene.drain(&w).await;
        let again = self.call(&w, &self.args).await;
        let status = self.status(&w, t.def).await;
        scene.drain(&w).await;
        let mut answer = format!("{}, retry {}", code(&first), code(&again));
        if let Some(status) = &status {
            answer.push_str(&format!(", status {status}"));
        }
        if !control.fired() {
            answer.push_str(" (no record write to lose)");
        }
        let mut row = Row::new(Scenario::LostReply, 1, self.effects_in(scene)).answer(answer);
        first_acted(&mut row, &first, acted);
        effects_verdict(
            &mut row,
            t,
            "after the record write's reply was lost, the retry ran the body again",
            "the outcome was not kept",
        );
        same_result(
            &mut row,
            &first,
            &again,
            "after the record write's reply was lost, a retry",
        );
        if status.as_deref().is_some_and(|s| s != "completed") {
            row.fail(format!(
                "after the record write's reply was lost, the status tool answered `{}`, not `completed`",
                status.unwrap_or_default()
            ));
        }
        row
    }

    /// Each write of the call fails once, in turn (before it is applied, then applied with its
    /// reply lost), and the model retries.
    async fn store_fails(&self, t: &Target<'_>) -> Row {
        if t.writes.is_empty() {
            return Row::not_run(
                Scenario::StoreFails,
                "the call writes nothing to the store (no key): a store failure cannot reach it",
            );
        }
        let mut runs = Vec::new();
        for at in &t.writes {
            for action in [Action::FailBefore, Action::LoseReply] {
                if let Some(run) = self.store_fault(t, at, action).await {
                    runs.push(run);
                }
            }
        }
        let answer = format!(
            "{} writes, each failed once, then each reply lost: {}; retries {}",
            t.writes.len(),
            tally(runs.iter().map(|r| &r.first)),
            tally(runs.iter().map(|r| &r.retry))
        );
        let most = runs.iter().map(|r| r.effects).max().unwrap_or(0);
        let mut row = Row::new(Scenario::StoreFails, 1, most).answer(answer);
        let steps = t.writes.iter().any(Boundary::is_step);
        for run in &runs {
            let mut judged = Row::new(Scenario::StoreFails, 1, run.effects);
            let fault = format!(
                "the store failed {} once ({})",
                run.at,
                run.action.describe()
            );
            if judged.observed > judged.expected {
                let invites = if invites_retry(&run.first) {
                    ", which invites a retry,"
                } else {
                    ""
                };
                let freed = if run.freed {
                    " and its key was freed"
                } else {
                    ""
                };
                let then = match no_key(t.def) {
                    Some(cause) => format!("the retry ran again; {cause}"),
                    None if run.freed && steps => "the retry ran the body again, and what it did outside its steps was done again: a tool with steps must do each of its effects inside a `ctx.once` step (a retry does not do a finished step again; the rest of the body it does)".to_string(),
                    None if run.freed => "the retry ran the body again: an answer that frees the key must mean that nothing was done".to_string(),
                    None => "the retry ran again".to_string(),
                };
                let times = match judged.observed {
                    2 => "twice".to_string(),
                    n => format!("{n} times"),
                };
                judged.fail(format!(
                    "did the work {times}: {fault}; the call answered {}{invites}{freed}; {then}",
                    code(&run.first)
                ));
            }
            match &run.retry {
                Ok(out) if judged.observed == 0 => judged.fail(format!(
                    "skipped work: after {fault}, the retry answered {} though nothing was done",
                    if out.replayed { "with a replay" } else { "ok" }
                )),
                Ok(_) => {}
                Err(err) if err.is(ErrorCode::OutcomeUnknown) => {}
                Err(err) => judged.fail(format!(
                    "after {fault}, the call answered {} and the retry {} ({}): one failed write must not keep the call from finishing",
                    code(&run.first),
                    err.code(),
                    err.message()
                )),
            }
            if let Some(what) = &run.unrecorded {
                judged.fail(format!(
                    "after {fault}, the store never took the record of {what}"
                ));
            }
            if judged.verdict == Verdict::Fail {
                row.expected = judged.expected;
                row.observed = judged.observed;
                row.fail(judged.reason.unwrap_or_default());
                break;
            }
        }
        row
    }

    /// One call whose write `at` the store fails once (`action`), then the model's retry: a
    /// new tool call with the same key (for a tool keyed on its place in the run, the same call
    /// again, the model's new call being the model retry row's).
    async fn store_fault(&self, t: &Target<'_>, at: &Boundary, action: Action) -> Option<Faulted> {
        let scene = self.scene();
        let control = Control::new(&self.tool);
        control.fault(at.clone(), action);
        let w = self.controlled(&scene, &control);
        let first = self.call(&w, &self.args).await;
        scene.drain(&w).await;
        if !control.fired() {
            // This call did not make that write (a body that writes otherwise each time).
            return None;
        }
        let freed = match control.tool_keys().first() {
            Some(key) => matches!(scene.store.get(key).await, Ok(None)),
            None => false,
        };
        let ctx = if t.per_call() {
            self.context.clone()
        } else {
            self.model_call(1)
        };
        let mut retry = w.call(&self.tool, self.args.clone(), &ctx).await;
        if matches!(&retry, Err(err) if err.is(ErrorCode::InProgress)) {
            // A reservation the failed write left behind: the retry after its lease lapsed.
            lapse(t, &scene);
            retry = w.call(&self.tool, self.args.clone(), &ctx).await;
        }
        scene.drain(&w).await;
        let unrecorded = lock(&scene.unrecorded).first().cloned();
        Some(Faulted {
            at: at.clone(),
            action,
            first,
            freed,
            retry,
            effects: self.effects_in(&scene),
            unrecorded,
        })
    }

    /// The worker dies at `at` (`action`), or where the call answered when it never gets
    /// there; once its lease lapsed, another worker gets the call. None: the body did not end.
    async fn crash_at(
        &self,
        t: &Target<'_>,
        scene: &Scene<W>,
        at: Option<&Boundary>,
        action: Action,
    ) -> Option<Crashed> {
        let control = Control::new(&self.tool);
        if let Some(at) = at {
            control.fault(at.clone(), action);
        }
        let dead = self.controlled(scene, &control);
        let mut first = self.spawn_call(&dead);
        // A call that never makes that write answers, and the worker dies before the answer
        // reaches anyone.
        let ended = tokio::select! {
            fired = control.fault_fired(BODY_LIMIT) => fired,
            _ = &mut first => true,
        };
        first.abort();
        if !ended {
            return None;
        }
        lapse(t, scene);
        let next = self.worker(scene, scene.store.clone(), None);
        let retry = self.call(&next, &self.args).await;
        let status = self.status(&next, t.def).await;
        scene.drain(&next).await;
        Some(Crashed {
            retry,
            status,
            recovered: next.stats().recovered > 0,
            effects: self.effects_in(scene),
        })
    }

    async fn crash(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        // At the tool's own record, after the body's effect: never at a step's record before it.
        let record = t.tool_record();
        let mut row = Row::new(Scenario::Crash, 1, 0);
        let Some(crashed) = self.crash_at(t, scene, record, Action::Die).await else {
            row.fail(format!(
                "the body did not end within {} s",
                BODY_LIMIT.as_secs()
            ));
            return row;
        };
        let Crashed {
            retry,
            status,
            recovered,
            effects,
        } = crashed;
        row.observed = effects;
        let mut answer = format!("worker died; retry {}", code(&retry));
        answer.push_str(looked_up(recovered, &retry));
        if let Some(status) = &status {
            answer.push_str(&format!(", status {status}"));
        }
        row.answer = answer;
        let twice = if recovered {
            "the recover hook found nothing, though the dead worker had acted; it must find the effect by what the key names"
        } else {
            "the dead worker's call was not seen by the next worker"
        };
        let died = match record {
            Some(record) => format!("after the worker died at {record}"),
            None => "after the worker died".to_string(),
        };
        effects_verdict(&mut row, t, &format!("{died}, the retry ran again"), twice);
        lapsed_or_fail(&mut row, &retry);
        if row.verdict == Verdict::Pass {
            match &retry {
                Err(err) if err.is(ErrorCode::OutcomeUnknown) => {
                    row.note("no recover hook: the model is told the outcome is unknown; `recover = ..` would answer it");
                    if status.as_deref().is_some_and(|s| s != "unknown") {
                        row.fail(format!(
                            "the status tool answered `{}` after the crash, not `unknown`",
                            status.unwrap_or_default()
                        ));
                    }
                }
                Ok(_) => {}
                Err(err) => row.fail(format!(
                    "{died}, the retry answered {} ({})",
                    err.code(),
                    err.message()
                )),
            }
        }
        row
    }

    /// The worker dies at each write of each step in turn, on a fresh scene each.
    async fn crash_at_step(&self, t: &Target<'_>) -> Row {
        let steps: Vec<&Boundary> = t.writes.iter().filter(|b| b.is_step()).collect();
        if steps.is_empty() {
            return Row::not_run(
                Scenario::CrashAtStep,
                "the call ran no `ctx.once` step: its writes are its reservation and its record, which the other crash rows try",
            );
        }
        let mut retries = Vec::new();
        let mut row = Row::new(Scenario::CrashAtStep, 1, 0);
        let mut failed: Option<Row> = None;
        for at in &steps {
            let scene = self.scene();
            let mut judged = Row::new(Scenario::CrashAtStep, 1, 0);
            let Some(crashed) = self.crash_at(t, &scene, Some(at), Action::Die).await else {
                judged.fail(format!(
                    "the body did not reach {at} within {} s",
                    BODY_LIMIT.as_secs()
                ));
                failed.get_or_insert(judged);
                continue;
            };
            let Crashed {
                retry,
                recovered,
                effects,
                ..
            } = crashed;
            judged.observed = effects;
            if matches!(&retry, Err(err) if err.is(ErrorCode::OutcomeUnknown)) && effects <= 1 {
                // Unknown: the effect happened or not, and the model is told so.
                judged.expected = effects;
            }
            let died = format!("after the worker died at {at}");
            let twice = if recovered {
                "the recover hook found nothing, though the dead worker had acted before it died: it must look for the effects of the body and of every step by what the key names"
            } else {
                "the dead worker's call was not seen by the next worker"
            };
            effects_verdict(
                &mut judged,
                t,
                &format!("{died}, the retry ran again"),
                twice,
            );
            match &retry {
                Ok(out) if effects == 0 => judged.fail(format!(
                    "skipped work: {died} (before acting), the retry answered {}{} though nothing was done",
                    if out.replayed { "with a replay" } else { "ok" },
                    looked_up(recovered, &retry)
                )),
                Ok(_) => {}
                Err(err) if err.is(ErrorCode::OutcomeUnknown) => {}
                Err(err) => judged.fail(format!(
                    "{died}, the retry answered {} ({})",
                    err.code(),
                    err.message()
                )),
            }
            lapsed_or_fail(&mut judged, &retry);
            if let Some(what) = lock(&scene.unrecorded).first() {
                judged.fail(format!("{died}, the store never took the record of {what}"));
            }
            retries.push(retry);
            if judged.verdict == Verdict::Fail {
                failed.get_or_insert(judged);
            } else if judged.observed >= row.observed {
                row.expected = judged.expected;
                row.observed = judged.observed;
            }
        }
        row.answer = format!(
            "{} step writes, the worker died at each: retries {}",
            steps.len(),
            tally(&retries)
        );
        if let Some(failed) = failed {
            row.expected = failed.expected;
            row.observed = failed.observed;
            row.fail(failed.reason.unwrap_or_default());
        }
        row
    }

    async fn crash_before_effect(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        if t.def.story() != Story::Idempotent {
            return Row::not_run(
                Scenario::CrashBeforeEffect,
                "no key: nothing is reserved before the body runs",
            );
        }
        let reserve = Boundary {
            op: WriteOp::Reserve,
            holder: Holder::Tool,
            nth: 0,
        };
        let mut row = Row::new(Scenario::CrashBeforeEffect, 0, 0);
        let Some(crashed) = self
            .crash_at(t, scene, Some(&reserve), Action::DieAfter)
            .await
        else {
            row.fail(format!(
                "the call did not reserve its key within {} s",
                BODY_LIMIT.as_secs()
            ));
            return row;
        };
        let Crashed {
            retry,
            recovered,
            effects,
            ..
        } = crashed;
        // With a recover hook the retry must find nothing and act; without one it is told the
        // outcome is unknown, and nothing is done.
        row.expected = usize::from(recovered);
        row.observed = effects;
        row.answer = format!(
            "worker died before acting; retry {}{}",
            code(&retry),
            looked_up(recovered, &retry)
        );
        if matches!(&retry, Ok(out) if out.replayed) && row.observed == 0 {
            row.fail("skipped work: the recover hook answered an effect that never happened (the worker died before its body ran); it must look the effect up in the outside system by what the key names, not assume it");
        }
        effects_verdict(
            &mut row,
            t,
            "after the worker died before acting, the retry ran twice",
            "",
        );
        lapsed_or_fail(&mut row, &retry);
        if row.verdict == Verdict::Pass {
            match &retry {
                Err(err) if err.is(ErrorCode::OutcomeUnknown) && !recovered => {}
                Ok(_) => {}
                Err(err) => row.fail(format!(
                    "after the worker died before acting, the retry answered {} ({})",
                    err.code(),
                    err.message()
                )),
            }
        }
        row
    }

    async fn lease_lapse(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let control = Control::new(&self.tool);
        control.hold_records(true);
        control.fail_renewals();
        let slow = self.controlled(scene, &control);
        let mut first = self.spawn_call(&slow);
        let mut answered = None;
        let ended = tokio::select! {
            reached = control.record_reached(BODY_LIMIT) => reached,
            joined = &mut first => {
                answered = Some(joined.unwrap_or_else(|e| panic_answer(&e)));
                true
            }
        };
        let mut row = Row::new(Scenario::LeaseLapse, 1, 0);
        if !ended {
            row.fail(format!(
                "the body did not end within {} s",
                BODY_LIMIT.as_secs()
            ));
            return row;
        }
        lapse(t, scene);
        let next = self.worker(scene, scene.store.clone(), None);
        let retry = self.call(&next, &self.args).await;
        control.hold_records(false);
        let first = match answered {
            Some(answer) => answer,
            None => match tokio::time::timeout(BODY_LIMIT, first).await {
                Ok(joined) => joined.unwrap_or_else(|e| panic_answer(&e)),
                Err(_) => Err(ToolError::internal("the first call never answered")),
            },
        };
        scene.drain(&slow).await;
        scene.drain(&next).await;
        let recovered = next.stats().recovered > 0;
        row.observed = self.effects_in(scene);
        row.answer = format!(
            "lease lapsed; retry {}{}, first call {}",
            code(&retry),
            looked_up(recovered, &retry),
            code(&first)
        );
        let twice = if recovered {
            "the recover hook found nothing, though the slow body had acted; it must find the effect by what the key names"
        } else {
            "the slow call's reservation was not seen by the next worker"
        };
        effects_verdict(
            &mut row,
            t,
            "while the slow body's lease had lapsed, the retry ran again",
            twice,
        );
        lapsed_or_fail(&mut row, &retry);
        if let (Ok(a), Ok(b)) = (&first, &retry) {
            if a.value != b.value && row.verdict == Verdict::Pass {
                row.fail("the slow call and the retry both answered success with different results for one action");
            }
        }
        row
    }

    async fn another_action(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let Some(other) = &self.other_action else {
            return Row::not_run(
                Scenario::OtherAction,
                "no other action given: .other_action(..) names a call that must run after the first",
            );
        };
        let w = self.worker(scene, scene.store.clone(), None);
        let first = self.call(&w, &self.args).await;
        let acted = self.effects_in(scene);
        let second = self.call(&w, other).await;
        scene.drain(&w).await;
        let mut row = Row::new(Scenario::OtherAction, 2, self.effects_in(scene)).answer(format!(
            "{}, then {}",
            code(&first),
            code(&second)
        ));
        first_acted(&mut row, &first, acted);
        let differ = ticked(&changed_fields(&self.args, other));
        let key = t
            .fields
            .template()
            .map(|k| format!("the key `{k}`"))
            .unwrap_or_else(|| "the tool".into());
        match &second {
            Err(err) if err.is(ErrorCode::Conflict) => row.fail(format!(
                "skipped work: the other action was refused as a CONFLICT: {key} does not tell it from the first (they differ in {differ}); put what tells actions apart in the key"
            )),
            Ok(out) if out.replayed => {
                let changed = changed_fields(&self.args, other);
                let ignored: Vec<String> = changed
                    .iter()
                    .filter(|f| t.def.ignored_arguments().contains(f))
                    .cloned()
                    .collect();
                let hint = if ignored.is_empty() {
                    String::new()
                } else {
                    let is = if ignored.len() == 1 { "is" } else { "are" };
                    format!(
                        "; {} {is} `#[arg(ignore)]`: an argument that changes the effect must reach the fingerprint",
                        ticked(&ignored)
                    )
                };
                row.fail(format!(
                    "skipped work: the other action was answered with the first one's result: {key} does not tell them apart (they differ in {differ}){hint}"
                ))
            }
            Err(err) => row.fail(format!(
                "the other action answered {} ({})",
                err.code(),
                err.message()
            )),
            Ok(_) => {}
        }
        if matches!(&second, Ok(out) if !out.replayed) && row.observed < row.expected {
            row.fail(format!(
                "skipped work: the other action answered ok and made no effect: something under {key} — a step's key, or the key the outside system deduplicates by — is shared with the first action (they differ in {differ})"
            ));
        }
        effects_verdict(
            &mut row,
            t,
            "the two actions made more effects than two",
            "",
        );
        row
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

/// What the recover hook did for a retry after a take-over.
fn looked_up(recovered: bool, retry: &Answer) -> &'static str {
    match retry {
        Ok(out) if recovered && out.replayed => " (found by the recover hook)",
        Ok(_) if recovered => " (the recover hook found nothing)",
        _ => "",
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

/// The crash and lease rows need the lease to have lapsed when the check moved the clock.
fn lapsed_or_fail(row: &mut Row, retry: &Answer) {
    if matches!(retry, Err(err) if err.is(ErrorCode::InProgress)) {
        row.fail("the retry answered IN_PROGRESS after the check moved the clock past the lease: the store does not judge leases by the clock the check gave it");
    }
}
