//! The same call again: made twice, retried after a timeout, made anew by the model, reworded,
//! and made many times at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::{
    code, effects_verdict, first_acted, invites_retry, panic_answer, same_result, tally, ticked,
    Scene, Target,
};
use crate::testing::report::{Row, Scenario};
use crate::testing::vary::{changed_fields, Variation};
use crate::testing::worker::{Control, WorkerStore};
use crate::testing::RetryCheck;
use crate::{ErrorCode, Story, ToolContext};

/// The timeout of the timeout scenario; its record write is held until the retries answered.
const TIMEOUT: Duration = Duration::from_millis(100);
/// How long the concurrency scenario waits for the duplicates before it lets the first finish.
const DUPLICATES_WAIT: Duration = Duration::from_secs(2);

impl<W> RetryCheck<W> {
    pub(super) async fn replay(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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

    pub(super) async fn timeout(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
    pub(super) async fn model_retry(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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

    pub(super) async fn reworded_retries(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
        let mut retries = t.fields.rewordings(&self.args);
        for args in &self.reworded {
            let changed = changed_fields(&self.args, args);
            retries.push(Variation {
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

    pub(super) async fn concurrent(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
}
