//! A worker that dies at a write, or whose lease lapses while its body runs: another worker gets
//! the call.

use std::time::Duration;

use super::{code, effects_verdict, lapse, lock, panic_answer, tally, Answer, Scene, Target};
use crate::testing::report::{Row, Scenario, Verdict};
use crate::testing::worker::{Action, Boundary, Control, Holder, WriteOp};
use crate::testing::RetryCheck;
use crate::{ErrorCode, Story, ToolError};

/// How long a body may take to reach its record write.
const BODY_LIMIT: Duration = Duration::from_secs(30);

/// A worker killed at one write, and the next worker's retry once its lease lapsed.
struct Crashed {
    retry: Answer,
    status: Option<String>,
    /// The retry asked the recover hook.
    recovered: bool,
    effects: usize,
}

impl<W> RetryCheck<W> {
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

    pub(super) async fn crash(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
    pub(super) async fn crash_at_step(&self, t: &Target<'_>) -> Row {
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

    pub(super) async fn crash_before_effect(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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

    pub(super) async fn lease_lapse(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
}

/// What the recover hook did for a retry after a take-over.
fn looked_up(recovered: bool, retry: &Answer) -> &'static str {
    match retry {
        Ok(out) if recovered && out.replayed => " (found by the recover hook)",
        Ok(_) if recovered => " (the recover hook found nothing)",
        _ => "",
    }
}

/// The crash and lease rows need the lease to have lapsed when the check moved the clock.
fn lapsed_or_fail(row: &mut Row, retry: &Answer) {
    if matches!(retry, Err(err) if err.is(ErrorCode::InProgress)) {
        row.fail("the retry answered IN_PROGRESS after the check moved the clock past the lease: the store does not judge leases by the clock the check gave it");
    }
}
