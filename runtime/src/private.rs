//! What generated code calls. Not public API: names and signatures change without notice.

use serde::Serialize;
use serde_json::Value;

pub use crate::context::StateMap;
pub use crate::fingerprint::{canonical_json, FingerprintFields, FingerprintSchema};
pub use crate::key::KeyBuilder;
pub use crate::store::Database;
pub use crate::story::{Annotations, Story};
pub use crate::tool::{
    Body, BoxFuture, Call, Invocation, KeyFn, Recover, Settings, StateNeed, StatusCompanion,
    ToolDefinition, TxBody,
};
pub use crate::{Fingerprint, KeyPart, RetryLimit, State, Tool, ToolContext, ToolError};
pub use ::core;
pub use ::schemars;
pub use ::serde;
pub use ::serde_json;
pub use ::std;

pub use crate::schema::{
    nullable_schema, parse_args, parse_flattened_args, prime_generator, schema_for,
    schema_for_flattened, status_schema, status_schema_for_flattened, struct_fields, FlattenedArgs,
    IgnoredField, StatusArgs,
};
use crate::texts;

/// A `#[tool]` fn's return type: `Result<T, E>` with a serializable `T` and `E: Into<ToolError>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tool result",
    label = "a `#[tool]` fn must return `Result<T, E>`",
    note = "`T` must implement `serde::Serialize` and `schemars::JsonSchema`, and `E` must convert into `toolkey::ToolError`"
)]
pub trait IntoToolResult {
    /// The success type.
    type Ok: Serialize + schemars::JsonSchema;
    /// Into the toolbox's form.
    fn into_tool_result(self) -> Result<Value, ToolError>;

    /// The JSON schema of the success type.
    fn output_schema() -> Value
    where
        Self: Sized,
    {
        schema_for::<Self::Ok>()
    }
}

impl<T, E> IntoToolResult for Result<T, E>
where
    T: Serialize + schemars::JsonSchema,
    E: Into<ToolError>,
{
    type Ok = T;
    fn into_tool_result(self) -> Result<Value, ToolError> {
        match self {
            Ok(value) => to_value(&value),
            Err(err) => Err(err.into()),
        }
    }
}

/// A recover hook's return type: `Result<Option<T>, E>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a recover hook result",
    label = "a recover hook must return `Result<Option<T>, E>`: `Some` when the effect is found, `None` when it is not",
    note = "`T` is the tool's own result type, and `E` must convert into `toolkey::ToolError`"
)]
pub trait IntoRecovered {
    /// Into the toolbox's form.
    fn into_recovered(self) -> Result<Option<Value>, ToolError>;
}

impl<T: Serialize, E: Into<ToolError>> IntoRecovered for Result<Option<T>, E> {
    fn into_recovered(self) -> Result<Option<Value>, ToolError> {
        match self {
            Ok(Some(value)) => to_value(&value).map(Some),
            Ok(None) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }
}

/// The body (or the recover hook) returned `Ok`: the effect happened. A result that cannot be
/// serialized is therefore an unknown outcome, kept as unknown, never a recorded failure.
fn to_value<T: Serialize>(value: &T) -> Result<Value, ToolError> {
    serde_json::to_value(value).map_err(|e| texts::unrecordable_result(&e.to_string()))
}

/// The fingerprint of one call of `tool`, from the fields that define the action.
pub fn fingerprint(fields: FingerprintFields<'_>) -> Result<Fingerprint, ToolError> {
    fields
        .finish()
        .map_err(|e| texts::unfingerprintable(&e.to_string()))
}

/// One argument of a tool without a key, on its way into the fingerprint its retry limit
/// counts calls by: added when its type is `Serialize` ([`AddSerializable`]), else the
/// fingerprint is given up ([`AddOpaque`], found second by method lookup), and calls are
/// counted by their JSON, so that no tool needs `Serialize` arguments for its limit.
pub struct FingerprintArg<'a, T: ?Sized>(pub &'a T);

/// See [`FingerprintArg`].
pub trait AddSerializable {
    /// Adds the argument as field `name`; true.
    fn add_to(&self, fields: &mut FingerprintFields<'_>, name: &'static str) -> bool;
}

impl<T: serde::Serialize + ?Sized> AddSerializable for FingerprintArg<'_, T> {
    fn add_to(&self, fields: &mut FingerprintFields<'_>, name: &'static str) -> bool {
        fields.field(name, self.0);
        true
    }
}

/// See [`FingerprintArg`].
pub trait AddOpaque {
    /// Adds nothing; false.
    fn add_to(&self, fields: &mut FingerprintFields<'_>, name: &'static str) -> bool;
}

impl<T: ?Sized> AddOpaque for &FingerprintArg<'_, T> {
    fn add_to(&self, _: &mut FingerprintFields<'_>, _: &'static str) -> bool {
        false
    }
}

/// `ctx.run_id` for key templates.
pub fn ctx_run_id(ctx: &ToolContext) -> Result<&str, ToolError> {
    Ok(ctx.run_id())
}

/// `ctx.step` for key templates: required when the template names it (a default step would
/// give every call of a run one key).
pub fn ctx_step(ctx: &ToolContext) -> Result<u64, ToolError> {
    ctx.step().ok_or_else(|| texts::missing_context("step"))
}

/// `ctx.tenant` for key templates: required when the template names it.
pub fn ctx_tenant(ctx: &ToolContext) -> Result<&str, ToolError> {
    ctx.tenant().ok_or_else(|| texts::missing_context("tenant"))
}

/// `ctx.event_id` for key templates: required when the template names it.
pub fn ctx_event_id(ctx: &ToolContext) -> Result<&str, ToolError> {
    ctx.event_id()
        .ok_or_else(|| texts::missing_context("event_id"))
}

/// The serde name of a unit enum variant, for `#[derive(KeyPart)]`.
pub fn write_serde_name<T: Serialize>(value: &T, out: &mut crate::KeyPartWriter<'_>) {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => out.canonical(&name),
        Ok(other) => out.canonical(&other.to_string()),
        Err(e) => out.canonical(&format!("unserializable:{e}")),
    }
}

/// Builds a `Body` from an async block.
pub fn body<F>(f: impl FnOnce(Invocation) -> F + Send + 'static) -> Body
where
    F: std::future::Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    Box::new(move |inv| Box::pin(f(inv)))
}

/// Builds a `Body` from a closure that takes the states a tool's fn needs and returns the fn's
/// future, and the function that turns the fn's result into the toolbox's form. Generic over
/// the future alone: a tool gets no async block of its own.
pub fn body_of<F, Fut>(f: F, into_result: fn(Fut::Output) -> Result<Value, ToolError>) -> Body
where
    F: FnOnce(Invocation) -> Result<Fut, ToolError> + Send + 'static,
    Fut: std::future::Future + Send + 'static,
{
    Box::new(move |inv| match f(inv) {
        Ok(future) => Box::pin(async move { into_result(future.await) }),
        Err(err) => Box::pin(std::future::ready(Err(err))),
    })
}

/// Builds a `Recover` from an async block.
pub fn recover<F>(f: impl FnOnce(Invocation) -> F + Send + 'static) -> Recover
where
    F: std::future::Future<Output = Result<Option<Value>, ToolError>> + Send + 'static,
{
    Box::new(move |inv| Box::pin(f(inv)))
}

pub use crate::IdempotencyKey;

/// A status companion's field that its target has and the status ignores: accepts any JSON.
pub struct Ignored;

impl<'de> serde::Deserialize<'de> for Ignored {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| Ignored)
    }
}

/// The status companion of keyed tool `target`, named `name`: a read-only tool taking
/// `input_schema` (the target's arguments, key fields required) and deriving the target's key
/// with `key`. Its description is written here once, not in every expansion.
pub fn status_companion(
    target: &str,
    name: &str,
    input_schema: Value,
    key: crate::tool::KeyFn,
) -> StatusCompanion {
    let description = texts::status_description(target);
    let definition = ToolDefinition::new(name, description, input_schema, Story::ReadOnly)
        .with_annotations(Annotations::for_story(Story::ReadOnly));
    StatusCompanion::new(definition, key)
}

/// A `#[tool]` fn's future: it runs in a task of its own, so it must be `Send`.
#[diagnostic::on_unimplemented(
    message = "the future of this `#[tool]` fn is not `Send`",
    label = "a tool's body runs in a task of its own, on any worker thread",
    note = "do not hold a value that is not `Send` (an `Rc`, a `RefCell` borrow, a `std::sync::MutexGuard`) across an `.await`: drop it first, or use `Arc` and `tokio::sync::Mutex`"
)]
pub trait SendFuture {}

impl<F: std::future::Future + Send> SendFuture for F {}

/// A `#[tool]` fn's future, checked to be `Send` where the macro spans the call (the tool's fn),
/// so a future that is not `Send` is reported once, there, and not again at every bound the
/// generated body passes through.
pub fn send_future<F: SendFuture>(future: F) -> SentFuture<F> {
    SentFuture(future)
}

/// A future [`send_future`] checked to be `Send`.
pub struct SentFuture<F>(F);

// SAFETY: the field is private and `send_future`, the only constructor, requires `F: Send`
// (`SendFuture` is implemented for `Send` futures only). Where that bound fails the program does
// not compile, so no `SentFuture` of a future that is not `Send` ever exists.
unsafe impl<F> Send for SentFuture<F> {}

impl<F: std::future::Future> std::future::Future for SentFuture<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        // SAFETY: the field is pinned structurally: it is never moved out of, `SentFuture` has
        // no `Drop`, and it is `Unpin` only when `F` is (the auto impl).
        unsafe { self.map_unchecked_mut(|sent| &mut sent.0) }.poll(cx)
    }
}

/// Drives a transactional SQLite body's future to its end on the blocking pool's thread, where
/// the body holds the store's write lock (see `TxBody::sqlite`).
#[cfg(feature = "sqlite")]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Handle::current().block_on(future)
}
