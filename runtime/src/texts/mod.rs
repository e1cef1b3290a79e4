//! Every text a model reads: error messages, suggestions, notes and the status companions'
//! descriptions.
//!
//! They are part of the API: a model follows them literally, so each says what happened and what
//! to do next. They live here, in one room, so they can be read (and reviewed) side by side, and
//! so one test can hold them all to the rules:
//!
//! - a text names tools, steps, fields and settings, never a key's values or an argument: keys
//!   and arguments carry personal data, and a terminal error is recorded and replayed; so every
//!   function here takes names, durations and times, never a value;
//! - a message starts in lower case and has no trailing period, as Rust's own messages do;
//! - a suggestion says what to do next, and whether to retry.

// One file per subject; callers name each text as `texts::name`, whichever file holds it.

// A call's arguments.
mod arguments;
// Keys, the caller's context, MCP `_meta`, state.
mod context;
// Unknown tools, approvals, failed tasks, timeouts.
mod toolbox;
// Retry limits and concurrency limits.
mod limits;
// Keys running, in conflict or unknown; replays, panics, lapsed leases.
mod keyed;
// Steps (`ctx.once`).
mod steps;
// Store failures.
mod store;
// MCP tasks.
mod tasks;
// Status companions.
mod status;
// Approval requests: awaiting, denied, not covered.
mod approvals;

// Transactional tools.
mod transactions;

#[cfg(test)]
mod tests;

pub(crate) use approvals::*;
pub(crate) use arguments::*;
pub(crate) use context::*;
pub(crate) use keyed::*;
pub(crate) use limits::*;
pub(crate) use status::*;
pub(crate) use steps::*;
pub(crate) use store::*;
// What MCP tasks say: read only by the MCP server.
#[cfg_attr(not(feature = "mcp"), allow(unused_imports))]
pub(crate) use tasks::*;
pub(crate) use toolbox::*;
pub(crate) use transactions::*;

/// The names a text about one call uses: the tool's, and its status companion's when it has one
/// (texts point the model there). A definition gives them with `ToolDefinition::named`, so this
/// module needs no definition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named<'a> {
    pub(crate) tool: &'a str,
    pub(crate) status: Option<&'a str>,
    /// The key holds the call's place in the run (`<ctx.step>`): a new call of the tool, the
    /// model's retry included, has a key of its own and is a new action, so no answer may
    /// tell the model that calling again is safe once the tool may have acted.
    pub(crate) per_call: bool,
}

/// Why a new call of a tool keyed on its place in the run would act again.
const NEW_CALL_NEW_ACTION: &str =
    "a new call of this tool is a new action, since its key is the call's place in the run";

/// serde's account of a problem with the values it quotes left out (`string "…"`, `integer
/// `…``): a result can hold an argument, and no text a model reads carries one. The names it
/// takes from the type, a missing or duplicate field's, are kept.
fn without_values(problem: &str) -> String {
    let mut kept = String::with_capacity(problem.len());
    let mut chars = problem.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                kept.push_str("\"…\"");
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
            }
            '`' => {
                let named = ["missing field ", "duplicate field "]
                    .iter()
                    .any(|field| kept.ends_with(field));
                let quoted: String = chars.by_ref().take_while(|&c| c != '`').collect();
                kept.push('`');
                kept.push_str(if named { &quoted } else { "…" });
                kept.push('`');
            }
            c => kept.push(c),
        }
    }
    kept
}
