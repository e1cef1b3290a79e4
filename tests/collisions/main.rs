//! Keys and steps that cannot collide, and answers a model can follow: every scenario is
//! counted on a fake outside system (payments, emails, refunds), and ends with an exact count.
//!
//! One module per behaviour; the outside system, the context and the toolbox most scenarios share
//! are here.

mod fingerprints;
mod flattened_fields;
mod flattened_parts;
mod keys;
mod outcomes;
mod status_answers;
mod status_fields;
mod steps;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use toolkey::{ToolContext, ToolError, Toolbox};

use fingerprints::Tag;
use keys::{Pair, Refund, Void};
use outcomes::{Layout, Ship, ShipNoHook, Statement};
use steps::{Bill, Charge, Pay, Remind};

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("acme-corp")
}

/// The outside world: every effect, named.
#[derive(Default)]
struct Outside {
    effects: Mutex<Vec<String>>,
    fail_receipt_once: AtomicBool,
    ship_reply_lost_once: AtomicBool,
}

impl Outside {
    fn act(&self, what: impl Into<String>) -> usize {
        let mut effects = self.effects.lock().unwrap();
        effects.push(what.into());
        effects.len()
    }
    fn count(&self, prefix: &str) -> usize {
        let effects = self.effects.lock().unwrap();
        effects.iter().filter(|e| e.starts_with(prefix)).count()
    }
}

/// A toolbox with the tools most scenarios share, on `out`.
fn toolbox(out: &Arc<Outside>) -> Toolbox {
    Toolbox::builder()
        .shared_state(out.clone())
        .tool(Bill)
        .tool(Remind)
        .tool(Charge)
        .tool(Pay)
        .tool(Ship)
        .tool(ShipNoHook)
        .tool(Refund)
        .tool(Pair)
        .tool(Tag)
        .tool(Statement)
        .tool(Layout)
        .tool(Void)
        .build()
        .unwrap()
}

/// The error a call of `tool` with `args` is refused with.
async fn refused(tb: &Toolbox, tool: &str, args: Value) -> ToolError {
    tb.call(tool, args.clone(), &ctx())
        .await
        .expect_err(&format!("`{tool}` takes {args}"))
}
