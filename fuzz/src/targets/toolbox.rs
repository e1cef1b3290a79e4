//! Tool arguments through the toolbox, and a status companion's arguments.

use serde_json::Value;
use toolkey::{ErrorCode, ToolOutput};

use super::{arguments, as_call_args, judge, tool_name};
use crate::gen::Gen;
use crate::harness::{check_size, Effects, Fixture, Tally};

/// Tool arguments through [`toolkey::Toolbox::call`]: up to three calls on one store, each
/// judged by the tool's schema and story, each accepted keyed call retried (as sent, and with
/// its sets in another order) and looked up with its status tool.
pub fn toolbox_call(bytes: &[u8], tally: &Tally) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        // A call may replay an earlier call's result: answers are bounded by all input so far.
        let mut sent = 0;
        for _ in 0..g.range(1, 3) {
            let name = tool_name(&mut g, fx);
            let args = arguments(&mut g, fx, &name);
            sent += name.len() + args.to_string().len();
            let (result, done) = fx.call(&name, args.clone());
            tally.answer(&result);
            judge(fx, &name, &args, &result, done);
            let answer = match &result {
                Ok(output) => output.value.to_string(),
                Err(err) => err.to_json().to_string(),
            };
            check_size(&answer, sent);
            let keyed = fx.tools.get(&name).is_some_and(|info| info.keyed());
            if let (Ok(first), true) = (&result, keyed) {
                check_retry(fx, &name, &as_call_args(&args), first);
            }
        }
    })
}

/// A keyed call that was accepted is answered the same on a retry, without running again;
/// with its sets in another order too; and its status tool reports its result.
fn check_retry(fx: &Fixture, name: &str, args: &Value, first: &ToolOutput) {
    let info = &fx.tools[name];
    let mut retries = vec![args.clone()];
    if !info.set_fields.is_empty() {
        let mut reordered = args.clone();
        for field in &info.set_fields {
            if let Some(Value::Array(items)) = reordered.get_mut(field) {
                items.reverse();
            }
        }
        retries.push(reordered);
    }
    for retry in retries {
        let (again, done) = fx.call(name, retry.clone());
        let again = again.unwrap_or_else(|e| {
            panic!("`{name}` accepted {args} and then answered its retry {retry} with {e:?}")
        });
        assert!(again.replayed, "`{name}`: a retry of {args} ran again");
        assert_eq!(again.value, first.value, "`{name}`: a retry of {args}");
        assert_eq!(done.effects, 0, "`{name}`: a retry of {args} acted");
    }
    if let Some(status) = &info.status_tool {
        let (answer, done) = fx.call(status, args.clone());
        let answer = answer.unwrap_or_else(|e| panic!("`{status}` with {args}: {e:?}"));
        assert_eq!(
            answer.value["status"], "completed",
            "`{status}` with {args}"
        );
        assert_eq!(
            answer.value["result"], first.value,
            "`{status}` with {args}"
        );
        assert_eq!(done.writes, 0, "`{status}` wrote");
    }
}

/// A status companion's arguments, after its target ran once with valid arguments (so some
/// answers are `completed`): never a write, never an effect, always a documented shape.
pub fn status_call(bytes: &[u8], tally: &Tally) {
    Fixture::with(|fx| {
        let mut g = Gen::new(bytes, &fx.fields);
        let statuses: Vec<&str> = fx
            .names
            .iter()
            .filter(|n| fx.tools[*n].is_status)
            .map(String::as_str)
            .collect();
        let status = *g.pick(&statuses);
        let target = fx
            .tools
            .values()
            .find(|t| t.status_tool.as_deref() == Some(status))
            .expect("a status tool has a target");
        // Run the target once, so that the status tool has something to find.
        let seeded = g.valid(&target.schema, &target.schema);
        let _ = fx.call(&target.name, seeded.clone());
        for _ in 0..g.range(1, 3) {
            let args = if g.chance(1, 4) {
                g.mutate(seeded.clone())
            } else {
                arguments(&mut g, fx, status)
            };
            let (result, done) = fx.call(status, args.clone());
            tally.answer(&result);
            judge(fx, status, &args, &result, done);
            assert_eq!(
                done,
                Effects {
                    writes: 0,
                    effects: 0
                },
                "`{status}` {args}"
            );
            match &result {
                Ok(output) => {
                    let value = &output.value;
                    let fields: Vec<&str> = match value["status"].as_str() {
                        Some("not_found" | "conflict") => vec!["detail", "status"],
                        Some("in_progress" | "unknown") => vec!["since", "status"],
                        Some("completed") => vec!["completed_at", "result", "status"],
                        Some("failed") => vec!["completed_at", "error", "status"],
                        _ => panic!("`{status}` answered {value}"),
                    };
                    // A record found with only the key checked says so in a note.
                    let noted = value.get("note").is_some_and(Value::is_string);
                    assert!(
                        !noted
                            || !matches!(value["status"].as_str(), Some("not_found" | "conflict")),
                        "`{status}` answered {value}"
                    );
                    let mut keys: Vec<&str> = value
                        .as_object()
                        .map(|o| {
                            o.keys()
                                .map(String::as_str)
                                .filter(|k| *k != "note")
                                .collect()
                        })
                        .unwrap_or_default();
                    keys.sort_unstable();
                    assert_eq!(keys, fields, "`{status}` answered {value}");
                }
                Err(err) => assert!(
                    err.is(ErrorCode::InvalidArguments),
                    "`{status}` with {args}: {err:?}"
                ),
            }
        }
    })
}
