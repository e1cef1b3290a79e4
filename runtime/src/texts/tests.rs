use std::time::{Duration, SystemTime};

use super::*;
use crate::store::StoreError;
use crate::story::Story;
use crate::{ErrorCode, ToolError};

const STORIES: [Story; 4] = [
    Story::ReadOnly,
    Story::Idempotent,
    Story::Natural,
    Story::Unkeyed,
];

fn named(status: Option<&str>) -> Named<'_> {
    Named {
        tool: "send_invoice",
        status,
        per_call: false,
    }
}

/// A tool keyed on its place in the run (`refund:<ctx.run_id>:<ctx.step>`).
fn per_call() -> Named<'static> {
    Named {
        tool: "refund",
        status: None,
        per_call: true,
    }
}

/// Every error text this module writes, from the names a call has (tool, step, field,
/// type, setting) and the words of the libraries below (serde, the store's driver).
fn every_error() -> Vec<ToolError> {
    let since = SystemTime::now() - Duration::from_secs(3);
    let mut errors = vec![
        arguments_not_an_object("send_invoice", "an array"),
        invalid_arguments(
            "send_invoice",
            ".",
            "missing field `amount`",
            Some("amount"),
            Some("number (Amount in EUR.)"),
        ),
        invalid_arguments(
            "send_invoice",
            "amount",
            "invalid type",
            Some("amount"),
            None,
        ),
        invalid_arguments("send_invoice", ".", "expected a map", None, None),
        arguments_not_json("send_invoice", "expected value at line 1 column 1"),
        provider_arguments_not_an_object("send_invoice", "a string"),
        wrong_item_type("tool_use", "text"),
        unfingerprintable("a number that is not finite"),
        control_character("customer", false),
        control_character("tenant", true),
        missing_context("step"),
        #[cfg(feature = "rig")]
        no_run_context(),
        bad_meta("toolkey/step", "a non-negative integer"),
        client_run_id_refused("RUN_ID_NOT_ACCEPTED", "toolkey/run_id"),
        run_required("refund", true),
        run_required("refund", false),
        no_session_for_run("toolkey/run_id"),
        no_state("app::Billing"),
        no_such_tool(
            unknown_tool("send_invoic"),
            ["send_invoice", "invoice_status"],
        ),
        no_such_tool(NO_TOOL_NAMED.into(), ["send_invoice"]),
        not_approved("wire_money"),
        awaiting_approval(
            named(Some("refund_status")),
            3,
            since + Duration::from_secs(3600),
        ),
        awaiting_approval(named(None), 1, since),
        approval_denied(named(None), 2),
        approval_conflict(named(None), 4, "approved"),
        task_failed("send_invoice", "task 7 was cancelled"),
        keyed_without_key("send_invoice"),
        looked_up_on_retry(
            ToolError::outcome_unknown("the payment provider timed out"),
            true,
            false,
        ),
        unrecordable_result("key must be a string"),
        panicked("`send_invoice`", "body"),
        lease_lost("`send_invoice`"),
        step_outside_keyed_tool("email"),
        bad_step_name("e mail"),
        step_conflict("email", false),
        step_conflict("email", true),
        step_in_progress("email", false),
        step_in_progress("email", true),
        step_reused("email"),
        step_unknown("email"),
        step_result_unfit("email", "invalid type: map, expected a string"),
        step_result_unfit(
            "email",
            "invalid type: string \"invoice:acme:2026-10\", expected u64",
        ),
        step_unrecordable("email", "unknown variant `2026-10`, expected `a` or `b`"),
        step_unrecordable("email", "key must be a string"),
        StoreError::Unavailable("connection refused".into()).refusal(),
        StoreError::Config("invalid table name".into()).refusal(),
        StoreError::Corrupt {
            tenant: "acme".into(),
            key: "invoice:acme:2026-10".into(),
            detail: "unknown state".into(),
        }
        .refusal(),
        StoreError::Unavailable("connection refused".into()).step_refusal("email", false),
        StoreError::Unavailable("connection refused".into()).step_refusal("email", true),
        StoreError::Config("invalid table name".into()).step_refusal("email", false),
        task_unrecorded("NO_OUTCOME", named(Some("invoice_status"))),
        task_unrecorded("NO_OUTCOME", per_call()),
        steps_done_per_call(
            StoreError::Unavailable("connection refused".into()).step_refusal("email", false),
        ),
        retry_limit("send_invoice", false, 5, Duration::from_secs(600), None),
        retry_limit(
            "send_invoice",
            true,
            5,
            Duration::from_secs(600),
            Some("GATEWAY_BUSY"),
        ),
        busy("send_invoice", 2, Duration::from_secs(2)),
    ];
    let steps: [Box<str>; 2] = ["charge".into(), "email".into()];
    for def in [named(Some("invoice_status")), per_call()] {
        for kept in [
            StepsKept::Named(&steps[..1]),
            StepsKept::Named(&steps),
            StepsKept::Some,
            StepsKept::Maybe,
        ] {
            let window = Duration::from_secs(600);
            errors.push(retry_limit_after_steps(def, 3, window, None, kept));
            errors.push(retry_limit_after_steps(
                def,
                3,
                window,
                Some("GATEWAY_BUSY"),
                kept,
            ));
        }
    }
    for status in [None, Some("invoice_status")] {
        let def = named(status);
        for story in STORIES {
            errors.push(timed_out(def, story, Duration::from_secs(2)));
        }
        errors.push(in_progress(def, since));
        for other in [Other::Ran, Other::Running, Other::Unknown] {
            errors.push(conflict(def, other));
        }
        errors.push(outcome_unknown(def, since, true));
        errors.push(outcome_unknown(def, since, false));
    }
    errors.push(timed_out(
        per_call(),
        Story::Idempotent,
        Duration::from_secs(2),
    ));
    errors.push(in_progress(per_call(), since));
    errors
}

/// serde quotes the values it could not read; a text about a result keeps the problem
/// and leaves those out, whatever they hold.
#[test]
fn a_serde_problem_is_told_without_the_values_it_quotes() {
    let cases = [
        (
            r#"invalid type: string "ann@example.com", expected struct Contact"#,
            r#"invalid type: string "…", expected struct Contact"#,
        ),
        (
            r#"invalid type: string "a \"quoted\" `one`", expected u64"#,
            r#"invalid type: string "…", expected u64"#,
        ),
        (
            "invalid value: integer `5`, expected a number below 3",
            "invalid value: integer `…`, expected a number below 3",
        ),
        (
            "unknown variant `ann`, expected `a` or `b`",
            "unknown variant `…`, expected `…` or `…`",
        ),
        ("missing field `tags`", "missing field `tags`"),
        ("duplicate field `id`", "duplicate field `id`"),
        (
            "invalid type: null, expected f64",
            "invalid type: null, expected f64",
        ),
        (r#"cut short: string "ann"#, r#"cut short: string "…""#),
        ("cut short: `ann", "cut short: `…`"),
    ];
    for (problem, told) in cases {
        assert_eq!(without_values(problem), told, "{problem}");
    }
}

#[test]
fn no_text_carries_a_key_or_an_argument() {
    // A corrupt record's error is the one text given a key: it names it by hash only.
    let corrupt = StoreError::Corrupt {
        tenant: "acme".into(),
        key: "invoice:acme:2026-10".into(),
        detail: "unknown state".into(),
    }
    .refusal();
    assert!(
        !corrupt.message().contains("invoice:acme:2026-10"),
        "{corrupt:?}"
    );
    assert!(corrupt.message().contains("key hash"), "{corrupt:?}");
    // Every other text is written from names alone: the only arguments of these functions
    // are names, durations, times and library words. A key's value or an argument could only
    // get in through a format string that reads one, and none does.
    for err in every_error() {
        let json = err.to_json().to_string();
        for value in ["invoice:acme:2026-10", "2026-10"] {
            assert!(!json.contains(value), "{value} in {json}");
        }
    }
}

#[test]
fn messages_and_suggestions_read_as_the_model_expects() {
    for err in every_error() {
        let message = err.message();
        assert!(!message.is_empty(), "{err:?}");
        let first = message.chars().next().unwrap();
        assert!(
            !first.is_uppercase(),
            "a message starts in lower case: {message}"
        );
        assert!(!message.ends_with('.'), "no trailing period: {message}");
        if let Some(suggestion) = err.suggestion() {
            assert!(
                !suggestion.is_empty() && !suggestion.ends_with('.'),
                "{err:?}"
            );
        }
        // A code toolkey answers with is one of its own.
        assert!(
            err.error_code().is_some()
                || ["RUN_ID_NOT_ACCEPTED", "NO_OUTCOME"].contains(&err.code()),
            "{err:?}"
        );
    }
}

#[test]
fn task_texts_read_as_the_model_expects() {
    let texts = [
        task_working("send_invoice"),
        TASK_NOT_FOUND.to_string(),
        task_unreadable("connection refused"),
    ];
    for text in texts {
        assert!(!text.starts_with(char::is_uppercase), "{text}");
        assert!(!text.ends_with('.'), "{text}");
    }
    let unrecorded = task_unrecorded("NO_OUTCOME", named(None));
    assert!(unrecorded.is_retryable(), "{unrecorded:?}");
}

#[test]
fn a_timeout_is_retryable_except_for_an_unkeyed_tool() {
    for story in STORIES {
        let err = timed_out(named(None), story, Duration::from_secs(2));
        assert_eq!(err.is_retryable(), story != Story::Unkeyed, "{story:?}");
    }
    let keyed = timed_out(
        named(Some("invoice_status")),
        Story::Idempotent,
        Duration::from_secs(2),
    );
    assert!(keyed.suggestion().unwrap().contains("`invoice_status`"));
}

#[test]
fn a_retry_limit_stops_the_model_and_busy_invites_a_later_retry() {
    let window = Duration::from_secs(600);
    for last in [None, Some("GATEWAY_BUSY")] {
        let err = retry_limit("send_invoice", false, 5, window, last);
        assert!(
            err.is(ErrorCode::RetryLimit) && !err.is_retryable(),
            "{err:?}"
        );
        assert!(err.message().contains("5 times"), "{err:?}");
        assert!(err.message().contains("10m"), "{err:?}");
        let suggestion = err.suggestion().unwrap();
        assert!(
            suggestion.starts_with("stop calling `send_invoice`"),
            "{err:?}"
        );
        assert!(suggestion.contains("tell the user"), "{err:?}");
    }
    let last = retry_limit("send_invoice", false, 5, window, Some("GATEWAY_BUSY"));
    assert!(last.message().contains("`GATEWAY_BUSY`"), "{last:?}");
    let busy = busy("send_invoice", 2, Duration::from_millis(1500));
    assert!(busy.is(ErrorCode::Busy) && busy.is_retryable(), "{busy:?}");
    assert!(busy.message().contains("1s 500ms"), "{busy:?}");
    assert!(busy.suggestion().unwrap().starts_with("nothing was done"));
}

/// A tool keyed on its place in the run: the model's retry is a new call with a key of its
/// own, so no answer after the tool may have acted invites one.
#[test]
fn a_tool_keyed_on_its_place_in_the_run_is_never_called_again_on_advice() {
    let since = SystemTime::now();
    let advice = [
        timed_out(per_call(), Story::Idempotent, Duration::from_secs(2)),
        in_progress(per_call(), since),
        looked_up_on_retry(ToolError::outcome_unknown("lost reply"), true, true),
        step_in_progress("email", true),
        StoreError::Unavailable("connection refused".into()).step_refusal("email", true),
        task_unrecorded("NO_OUTCOME", per_call()),
        steps_done_per_call(
            ToolError::new("MAIL_DOWN", "the mail server is down").with_retryable(true),
        ),
    ];
    for err in advice {
        assert!(!err.is_retryable(), "{err:?}");
        let suggestion = err.suggestion().unwrap();
        assert!(suggestion.contains("do not"), "{err:?}");
        assert!(!suggestion.contains("call again with"), "{err:?}");
    }
    let conflict = step_conflict("email", true);
    assert!(!conflict.suggestion().unwrap().contains("call again"));
    // Keyed on the action, the same answers invite the retry that replays.
    let keyed = timed_out(named(None), Story::Idempotent, Duration::from_secs(2));
    assert!(keyed.is_retryable(), "{keyed:?}");
    let looked = looked_up_on_retry(ToolError::outcome_unknown("lost reply"), true, false);
    assert!(looked.is_retryable(), "{looked:?}");
}

#[test]
fn a_keyed_tools_retry_limit_says_it_counts_by_key() {
    let window = Duration::from_secs(600);
    let keyed = retry_limit("transfer", true, 10, window, None);
    assert!(keyed.message().contains("for this key"), "{keyed:?}");
    assert!(
        keyed.message().contains("whatever its other arguments"),
        "{keyed:?}"
    );
    assert!(!keyed.message().contains("these arguments"), "{keyed:?}");
    assert!(keyed
        .suggestion()
        .unwrap()
        .contains("`transfer` for this key"));
    assert!(
        keyed.message().contains("for this key (every call"),
        "{keyed:?}"
    );
    let unkeyed = retry_limit("transfer", false, 10, window, None);
    assert!(
        unkeyed.message().contains("with these arguments"),
        "{unkeyed:?}"
    );
}

#[test]
fn only_an_unreachable_store_is_worth_retrying() {
    let down = StoreError::Unavailable("connection refused".into()).refusal();
    assert!(down.is(ErrorCode::StoreUnavailable) && down.is_retryable());
    let wrong = StoreError::Config("invalid table name".into()).refusal();
    assert!(wrong.is(ErrorCode::StoreUnavailable) && !wrong.is_retryable());
    assert!(wrong.suggestion().unwrap().starts_with("do not retry"));
    // Nor inside a step: a misconfigured store is not "could not be reached".
    let step = StoreError::Config("invalid table name".into()).step_refusal("email", false);
    assert!(!step.is_retryable(), "{step:?}");
    assert!(step.suggestion().unwrap().starts_with("do not retry"));
}
