//! The `Tool` trait, and what one call of a tool is: its body, its recover hook, what they
//! receive; and a keyed tool's status companion.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

use super::ToolDefinition;
use crate::context::StateMap;
use crate::{Fingerprint, IdempotencyKey, State, ToolContext, ToolError};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What one call of a tool does, produced by [`Tool::prepare`] once its arguments are valid.
pub struct Call {
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) body: Body,
    pub(crate) recover: Option<Recover>,
    /// For a key on the call's place in the run: the key at one fixed place, under which (with
    /// the fingerprint) the retry limit counts the call's failures.
    pub(crate) limit_key: Option<IdempotencyKey>,
    /// A transactional call's body, run in place of `body`.
    pub(crate) tx: Option<super::TxBody>,
}

/// The body of a call: runs the tool's fn.
pub type Body = Box<dyn FnOnce(Invocation) -> BoxFuture<'static, Result<Value, ToolError>> + Send>;
/// A recover hook: looks in the outside system for the outcome of an earlier call.
pub type Recover =
    Box<dyn FnOnce(Invocation) -> BoxFuture<'static, Result<Option<Value>, ToolError>> + Send>;

impl Call {
    /// A call without a key (`read_only`, `natural`, `unkeyed` tools).
    pub fn unkeyed(body: Body) -> Call {
        Call {
            key: None,
            fingerprint: None,
            body,
            recover: None,
            limit_key: None,
            tx: None,
        }
    }

    /// A keyed call.
    pub fn keyed(key: IdempotencyKey, fingerprint: Fingerprint, body: Body) -> Call {
        Call {
            key: Some(key),
            fingerprint: Some(fingerprint),
            body,
            recover: None,
            limit_key: None,
            tx: None,
        }
    }

    /// A keyed call of a transactional tool: `body` runs in the transaction that holds the
    /// key's record (see [`ToolDefinition::with_transaction`](super::ToolDefinition::with_transaction)).
    pub fn transactional(
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        body: super::TxBody,
    ) -> Call {
        let database = body.database();
        // Never run: the executor runs `tx` in its place.
        let outside: Body = Box::new(move |_| {
            Box::pin(std::future::ready(Err(ToolError::internal(format!(
                "a transactional call's body runs only in a {database} transaction"
            )))))
        });
        Call::keyed(key, fingerprint, outside).with_transaction(body)
    }

    /// The call's idempotency key (keyed tools only).
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// The fingerprint of the call's defining arguments (keyed tools only).
    pub fn fingerprint(&self) -> Option<&Fingerprint> {
        self.fingerprint.as_ref()
    }

    /// Counts the call's failures against its retry limit under `key` (the call's key with its
    /// place in the run fixed) and its fingerprint, rather than under its own key, which is new
    /// at every call. Generated code calls it for keys on `<ctx.step>`.
    #[doc(hidden)]
    pub fn with_limit_key(mut self, key: IdempotencyKey) -> Call {
        self.limit_key = Some(key);
        self
    }

    /// A keyed call of a transactional tool (see
    /// [`ToolDefinition::with_transaction`](super::ToolDefinition::with_transaction)): `body`
    /// runs in the transaction that holds the key's record, in place of the call's own body.
    pub fn with_transaction(mut self, body: super::TxBody) -> Call {
        self.tx = Some(body);
        self
    }

    /// Adds a recover hook.
    pub fn with_recover(mut self, recover: Recover) -> Call {
        self.recover = Some(recover);
        self
    }
}

/// What a body or recover hook receives: its context and the toolbox's state.
pub struct Invocation {
    pub(crate) ctx: ToolContext,
    pub(crate) state: Arc<StateMap>,
}

impl Invocation {
    /// The call's context.
    pub fn context(&self) -> &ToolContext {
        &self.ctx
    }

    /// The context, taken out.
    pub fn into_context(self) -> ToolContext {
        self.ctx
    }

    /// The state of type `T`.
    pub fn state<T: Send + Sync + 'static>(&self) -> Result<State<T>, ToolError> {
        self.state.get::<T>()
    }
}

/// A read-only status companion of a keyed tool: its definition and how it derives the key.
pub struct StatusCompanion {
    pub(crate) definition: ToolDefinition,
    pub(crate) key: KeyFn,
}

/// Derives a keyed tool's key from its status companion's arguments.
pub type KeyFn =
    Box<dyn Fn(Value, &ToolContext) -> Result<IdempotencyKey, ToolError> + Send + Sync>;

impl StatusCompanion {
    /// A companion with the given definition and key derivation.
    pub fn new(definition: ToolDefinition, key: KeyFn) -> Self {
        StatusCompanion { definition, key }
    }
}

/// A tool the toolbox can run. `#[tool]` implements it for the unit struct it generates.
pub trait Tool: Send + Sync + 'static {
    /// The tool's definition.
    fn definition(&self) -> ToolDefinition;

    /// Validates the arguments and prepares the call: its key and fingerprint (for keyed tools)
    /// and its body. Invalid arguments are `INVALID_ARGUMENTS`, and nothing is recorded. The
    /// arguments stay the caller's: a call without a key is counted by them if it fails.
    /// Written by `#[tool]`.
    #[doc(hidden)]
    fn prepare(&self, args: &Value, ctx: &ToolContext) -> Result<Call, ToolError>;

    /// The status companion, for keyed tools that have one. Written by `#[tool]`.
    #[doc(hidden)]
    fn status_companion(&self) -> Option<StatusCompanion> {
        None
    }
}

impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn definition(&self) -> ToolDefinition {
        (**self).definition()
    }
    fn prepare(&self, args: &Value, ctx: &ToolContext) -> Result<Call, ToolError> {
        (**self).prepare(args, ctx)
    }
    fn status_companion(&self) -> Option<StatusCompanion> {
        (**self).status_companion()
    }
}
