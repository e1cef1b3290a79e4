//! Keys and the caller's context: a control character in a key, a context the key needs and
//! the caller lacks, an MCP request's `_meta`, state the toolbox was not given.

use crate::{ErrorCode, ToolError};

/// A key field holds a control character: named by its field, never shown.
pub(crate) fn control_character(field: &str, from_ctx: bool) -> ToolError {
    if from_ctx {
        ToolError::new(
            ErrorCode::MissingContext,
            format!("the caller's `ctx.{field}` holds a control character, which cannot be part of an idempotency key"),
        )
        .with_suggestion(RUNTIME_DEFECT)
    } else {
        ToolError::new(
            ErrorCode::InvalidArguments,
            format!("`{field}` holds a control character (such as NUL or a line break inside the text), which cannot be part of an idempotency key"),
        )
        .with_suggestion(format!("send `{field}` without control characters; the same value will be refused again"))
    }
}

const RUNTIME_DEFECT: &str =
    "this is a defect in the agent runtime, not in the arguments: report it; do not retry";

/// The key uses `ctx.{field}`, and the caller's context has none.
pub(crate) fn missing_context(field: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("this tool's key uses `ctx.{field}`, and the caller's ToolContext has none"),
    )
    .with_suggestion(RUNTIME_DEFECT)
}

/// An agent framework ran a tool without the run context the program should have passed.
#[cfg(feature = "rig")]
pub(crate) fn no_run_context() -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        "the program running this agent gave the tool no run context, so nothing ran",
    )
    .with_suggestion(
        "this is a defect in the program, not in the arguments: tell the user the action could not be done; do not retry",
    )
}

/// An MCP request's `_meta.{key}` is not what it must be (`expected`).
pub(crate) fn bad_meta(key: &str, expected: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("the request's `_meta.{key}` must be {expected}"),
    )
    .with_suggestion(
        "this is a defect in the MCP client, not in the arguments: report it; do not retry",
    )
}

/// An MCP request names a run id or event id (`_meta.{key}`) the server does not accept.
pub(crate) fn client_run_id_refused(code: &'static str, key: &str) -> ToolError {
    ToolError::new(
        code,
        format!("this server does not accept client run ids: the request names `_meta.{key}`"),
    )
    .with_suggestion("this is a defect in the MCP client, not in the arguments: remove the run id from the request (every call of a session runs in the session's own run), or ask the server's operator to accept client run ids; do not retry as is")
}

/// An MCP request with no session and no run named calls `tool`, whose key needs a run
/// (`ctx.run_id`, `ctx.step`). `may_name`: the server accepts the run ids clients name.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn run_required(tool: &str, may_name: bool) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("`{tool}` keys each action by its run (`ctx.run_id` or `ctx.step`), and this request names no run and belongs to no MCP session, so nothing ran: a run made for one request would be made again for its retry, and the retry would act again"),
    )
    .with_suggestion(match may_name {
        true => "name the run in the request's `_meta[\"toolkey/run_id\"]`, the same on every retry of this call, or call within an MCP session (`initialize`); do not retry as is",
        false => "call within an MCP session (`initialize` first): this server does not accept run ids named in `_meta`; do not retry as is",
    })
}

/// An MCP request names a run id or event id (`_meta.{key}`) to be scoped to its session, and
/// belongs to none.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) fn no_session_for_run(key: &str) -> ToolError {
    ToolError::new(
        ErrorCode::MissingContext,
        format!("this server keeps the run ids clients name per MCP session, and this request names `_meta.{key}` without one, so nothing ran"),
    )
    .with_suggestion("call within an MCP session (`initialize` first), naming the same run on every retry of this call; do not retry as is")
}

/// A body asked for state of a type the toolbox was not given.
pub(crate) fn no_state(type_name: &str) -> ToolError {
    ToolError::internal(format!(
        "no state of type `{type_name}` in the toolbox: add it with Toolbox::builder().state(..)"
    ))
}
