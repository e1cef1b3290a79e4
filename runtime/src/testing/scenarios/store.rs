//! A store that fails: a reply lost after the record write, and each write of the call failed
//! once in turn.

use super::{
    code, effects_verdict, first_acted, invites_retry, lapse, lock, no_key, same_result, tally,
    Answer, Scene, Target,
};
use crate::testing::report::{Row, Scenario, Verdict};
use crate::testing::worker::{Action, Boundary, Control};
use crate::testing::RetryCheck;
use crate::ErrorCode;

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
    pub(super) async fn lost_reply(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
    pub(super) async fn store_fails(&self, t: &Target<'_>) -> Row {
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
}
