//! Calls that are other actions: other arguments under the same key, and another action the key
//! must tell apart from the first.

use super::{code, effects_verdict, first_acted, ticked, Scene, Target};
use crate::testing::report::{Row, Scenario};
use crate::testing::vary::changed_fields;
use crate::testing::RetryCheck;
use crate::ErrorCode;

impl<W> RetryCheck<W> {
    pub(super) async fn other_arguments(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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

    pub(super) async fn another_action(&self, t: &Target<'_>, scene: &Scene<W>) -> Row {
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
