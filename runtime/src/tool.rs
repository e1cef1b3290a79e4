//! The `Tool` trait the `#[tool]` attribute implements, and a tool's definition.

use std::any::TypeId;
use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::context::StateMap;
use crate::story::{Annotations, Story};
use crate::texts::Named;
use crate::{Fingerprint, IdempotencyKey, State, ToolContext, ToolError};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a keyed tool runs: defaults from DESIGN (lease 30 s, retention 7 days, no timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// How long the caller waits before TIMEOUT (the body goes on). `None`: until it ends.
    pub timeout: Option<Duration>,
    /// How long a reservation holds without renewal; renewed while the body runs.
    pub lease: Duration,
    /// How long a completed outcome is replayed.
    pub retain: Duration,
    /// With `on_in_progress = "wait(..)"`: how long a duplicate waits for the first call.
    pub wait_in_progress: Option<Duration>,
    /// How many retryable failures of one call the tool accepts within a window before the call
    /// is answered `RETRY_LIMIT` (`retry_limit = "5/10m"`). [`RetryLimit::toolbox`] until the
    /// toolbox is built, which puts its own limit there.
    pub retry_limit: RetryLimit,
    /// At most this many of the tool's bodies run at once in this process (`concurrency = 2`);
    /// a call beyond it waits for a slot within its timeout, then is answered `BUSY`. `None`:
    /// no limit.
    pub concurrency: Option<NonZeroUsize>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timeout: None,
            lease: Duration::from_secs(30),
            retain: Duration::from_secs(7 * 24 * 60 * 60),
            wait_in_progress: None,
            retry_limit: RetryLimit::toolbox(),
            concurrency: None,
        }
    }
}

/// The retry limit of a tool in a toolbox that sets none: 10 failures of one call within 10
/// minutes. Far past the two or three retries a model makes when a failure is passing, and well
/// before a loop costs much.
pub(crate) const DEFAULT_RETRY_LIMIT: RetryLimit = RetryLimit::after(10, Duration::from_secs(600));

/// How many retryable failures of one call a tool accepts within a window.
///
/// One call is one key for an `idempotent` tool; for a key on `<ctx.step>`, new at every call,
/// it is the key at a fixed step, the run and the arguments' fingerprint, what the model's retry
/// repeats. For every other story it is one tool with one set of arguments in one tenant, as the
/// tool receives them (read into its types, defaults applied, `#[arg(ignore)]` fields left out),
/// not as the JSON spells them. A failure is an answer that
/// invites a retry after the tool's code ran: a retryable error of the body or the recover hook,
/// a retryable `TIMEOUT` of a tool without a key (a keyed call's body goes on, and its retry finds
/// it in progress), an unknown outcome a recover hook will look up. When the count reaches
/// the limit, that answer and every later one for the same call within the window is
/// `RETRY_LIMIT` (not retryable), and the body does not run; when the key's record is unknown,
/// the answer says the action may have happened, and when a `ctx.once` step of the call had
/// finished, it says that part of the action was done and is kept. The window starts at the first failure; when it
/// ends the count starts again from zero. A success clears the count.
///
/// `"5/10m"`: five failures within ten minutes. `"off"`: no limit.
///
/// ```
/// use std::time::Duration;
/// use toolkey::RetryLimit;
///
/// let limit: RetryLimit = "5/10m".parse().unwrap();
/// assert_eq!(limit, RetryLimit::after(5, Duration::from_secs(600)));
/// assert_eq!((limit.failures(), limit.window()), (Some(5), Some(Duration::from_secs(600))));
/// assert_eq!("off".parse::<RetryLimit>().unwrap(), RetryLimit::off());
/// assert!("0/10m".parse::<RetryLimit>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetryLimit(LimitKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum LimitKind {
    #[default]
    Toolbox,
    Off,
    After {
        failures: u32,
        window: Duration,
    },
}

impl RetryLimit {
    /// The toolbox's limit: what a tool that states none gets (see
    /// [`ToolboxBuilder::default_retry_limit`](crate::ToolboxBuilder::default_retry_limit)).
    pub const fn toolbox() -> RetryLimit {
        RetryLimit(LimitKind::Toolbox)
    }

    /// No limit: the same failing call may run again and again.
    pub const fn off() -> RetryLimit {
        RetryLimit(LimitKind::Off)
    }

    /// `failures` retryable failures of one call within `window`; the next answer is
    /// `RETRY_LIMIT`.
    ///
    /// # Panics
    ///
    /// When `failures` is 0 or `window` is zero: such a limit would refuse every call.
    pub const fn after(failures: u32, window: Duration) -> RetryLimit {
        assert!(
            failures > 0 && !window.is_zero(),
            "a retry limit allows at least one failure within a window longer than zero"
        );
        RetryLimit(LimitKind::After { failures, window })
    }

    /// How many failures the limit allows, unless it is off or the toolbox's.
    pub const fn failures(&self) -> Option<u32> {
        match self.0 {
            LimitKind::After { failures, .. } => Some(failures),
            _ => None,
        }
    }

    /// The window the failures are counted in, unless the limit is off or the toolbox's.
    pub const fn window(&self) -> Option<Duration> {
        match self.0 {
            LimitKind::After { window, .. } => Some(window),
            _ => None,
        }
    }

    /// True for [`RetryLimit::off`].
    pub const fn is_off(&self) -> bool {
        matches!(self.0, LimitKind::Off)
    }

    /// True for [`RetryLimit::toolbox`].
    pub const fn is_toolbox(&self) -> bool {
        matches!(self.0, LimitKind::Toolbox)
    }

    /// This limit, or `fallback` where this one is the toolbox's.
    pub(crate) fn or(self, fallback: RetryLimit) -> RetryLimit {
        if self.is_toolbox() {
            fallback
        } else {
            self
        }
    }
}

impl std::str::FromStr for RetryLimit {
    type Err = String;

    /// `"<failures>/<window>"` (`"5/10m"`, `"3/30s"`) or `"off"`.
    fn from_str(text: &str) -> Result<RetryLimit, String> {
        if text == "off" {
            return Ok(RetryLimit::off());
        }
        let expected = "expected failures and a window, as in `\"5/10m\"`, or `\"off\"`";
        let Some((failures, window)) = text.split_once('/') else {
            return Err(format!("invalid retry limit `{text:?}`: {expected}"));
        };
        let failures: u32 = failures.trim().parse().map_err(|_| {
            format!("invalid retry limit `{text:?}`: `{failures}` is not a count of failures; {expected}")
        })?;
        if failures == 0 {
            return Err(format!(
                "invalid retry limit `{text:?}`: it allows no failure, so no call would run; allow at least 1, or write `\"off\"`"
            ));
        }
        let window = match humantime::parse_duration(window.trim()) {
            Ok(window) if !window.is_zero() => window,
            _ => {
                return Err(format!(
                    "invalid retry limit `{text:?}`: `{window}` is not a window; {expected}"
                ))
            }
        };
        Ok(RetryLimit::after(failures, window))
    }
}

impl fmt::Display for RetryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            LimitKind::Toolbox => f.write_str("the toolbox's"),
            LimitKind::Off => f.write_str("off"),
            LimitKind::After { failures, window } => {
                write!(f, "{failures}/{}", humantime::format_duration(window))
            }
        }
    }
}

/// A state type a tool needs from the toolbox.
#[derive(Debug, Clone, Copy)]
pub struct StateNeed {
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
}

impl StateNeed {
    /// The need for `State<T>`.
    pub fn of<T: Send + Sync + 'static>() -> StateNeed {
        StateNeed {
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
        }
    }
}

/// Everything known about a tool before it is called: name, description, schemas, story.
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    pub(crate) name: String,
    pub(crate) title: Option<String>,
    pub(crate) description: String,
    pub(crate) input_schema: Value,
    pub(crate) output_schema: Option<Value>,
    pub(crate) story: Story,
    pub(crate) annotations: Annotations,
    pub(crate) settings: Settings,
    pub(crate) status_tool: Option<String>,
    pub(crate) needs: Vec<StateNeed>,
    pub(crate) key_template: Option<String>,
    /// The key template holds `<ctx.step>` (read once, when it is set: every keyed call asks).
    follows_step: bool,
    pub(crate) ignored_arguments: Vec<String>,
    /// A call's arguments read into the tool's types and fingerprinted (tools without a key):
    /// what retry limits count such a call by.
    pub(crate) arguments_fingerprint: Option<ArgumentsFingerprint>,
    pub(crate) case_insensitive_arguments: Vec<String>,
    /// Parameters the arguments' JSON spells otherwise: (the fn's name, the JSON's name).
    renamed_arguments: Vec<(String, String)>,
    /// Other names the arguments' JSON may give an argument: (its JSON name, an alias).
    argument_aliases: Vec<(String, String)>,
    /// The parameters, in the order serde reads them, when one is `#[serde(flatten)]`.
    parameters: Vec<Parameter>,
    /// The check of the objects below the arguments' top level, read from the input schema
    /// when the toolbox is built: none where no closed object is below it.
    pub(crate) nested: Option<std::sync::Arc<crate::schema::Nested>>,
}

/// A parameter of a tool with a `#[serde(flatten)]` one, as the macro declares it.
#[derive(Clone, Debug)]
enum Parameter {
    /// A field of its own, by its JSON name.
    Own(String),
    /// A flattened parameter: its name, the fields a struct reads by name (none for an enum, a
    /// map, or a struct that flattens a field of its own: serde leaves those fields to the
    /// parameters after it), and its schema.
    Flattened {
        name: String,
        takes: &'static [&'static str],
        schema: fn() -> Value,
    },
}

impl ToolDefinition {
    /// Prepares a call of `tool`, which this definition (as the toolbox holds it) describes:
    /// its arguments read by the tool's type, then the objects below their top level checked,
    /// a field their schema does not take there refused, naming it (see
    /// [`Nested`](crate::schema::Nested)). Every reading of a call's arguments goes through
    /// here: the call's own, its status companion's, and an MCP task's.
    pub(crate) fn prepare(
        &self,
        tool: &dyn Tool,
        args: &Value,
        ctx: &crate::ToolContext,
    ) -> Result<Call, ToolError> {
        let call = tool.prepare(args, ctx)?;
        let (Some(nested), Value::Object(object)) = (&self.nested, args) else {
            return Ok(call);
        };
        nested.check(object).map(|()| call).map_err(|refused| {
            let field = Some(refused.field.as_str());
            crate::texts::invalid_arguments(
                &self.name,
                &refused.path,
                &refused.problem,
                field,
                None,
            )
        })
    }

    /// A definition with the given name, description and input schema, and the story's defaults.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        story: Story,
    ) -> Self {
        ToolDefinition {
            name: name.into(),
            title: None,
            description: description.into(),
            input_schema,
            output_schema: None,
            story,
            annotations: Annotations::for_story(story),
            settings: Settings::default(),
            status_tool: None,
            needs: Vec::new(),
            key_template: None,
            follows_step: false,
            ignored_arguments: Vec::new(),
            arguments_fingerprint: None,
            case_insensitive_arguments: Vec::new(),
            renamed_arguments: Vec::new(),
            argument_aliases: Vec::new(),
            parameters: Vec::new(),
            nested: None,
        }
    }

    /// Declares a parameter of its own, by its JSON name, beside a `#[serde(flatten)]` one:
    /// in the order the arguments type declares them. Generated code calls it.
    #[doc(hidden)]
    pub fn with_own_parameter(mut self, name: impl Into<String>) -> Self {
        self.parameters.push(Parameter::Own(name.into()));
        self
    }

    /// Declares a `#[serde(flatten)]` parameter: the fields its struct reads by name
    /// ([`struct_fields`](crate::struct_fields)), and its schema. Generated code calls it.
    #[doc(hidden)]
    pub fn with_flattened_parameter(
        mut self,
        name: impl Into<String>,
        takes: &'static [&'static str],
        schema: fn() -> Value,
    ) -> Self {
        self.parameters.push(Parameter::Flattened {
            name: name.into(),
            takes,
            schema,
        });
        self
    }

    /// Sets a human-readable title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the JSON schema of the result.
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Sets the annotations. A tool keyed on its place in the run stays not idempotent (see
    /// [`with_key_template`](Self::with_key_template)).
    pub fn with_annotations(mut self, annotations: Annotations) -> Self {
        self.annotations = annotations;
        if self.key_follows_step() {
            self.annotations.idempotent = false;
        }
        self
    }

    /// Sets how the tool runs.
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// Names the tool's status companion.
    pub fn with_status_tool(mut self, name: impl Into<String>) -> Self {
        self.status_tool = Some(name.into());
        self
    }

    /// Sets the key template, as written in `idempotent(key = "...")`.
    ///
    /// A template with `<ctx.step>` keys each call by its place in the run: the same call handed
    /// over again replays, but a new call of the tool, the model's own retry included, is a new
    /// action. Such a tool is not idempotent in MCP's sense (`idempotentHint` turns false), and
    /// its answers never tell the model that calling again is safe.
    pub fn with_key_template(mut self, template: impl Into<String>) -> Self {
        let template = template.into();
        self.follows_step = crate::key::follows_step(&template);
        if self.follows_step {
            self.annotations.idempotent = false;
        }
        self.key_template = Some(template);
        self
    }

    /// True when the key template holds `<ctx.step>`: each call of the tool has a key of its
    /// own (see [`with_key_template`](Self::with_key_template)).
    pub(crate) fn key_follows_step(&self) -> bool {
        self.follows_step
    }

    /// Declares an argument `#[arg(ignore)]`, by its name in the arguments' JSON: left out of
    /// the fingerprint.
    pub fn with_ignored_argument(mut self, name: impl Into<String>) -> Self {
        self.ignored_arguments.push(name.into());
        self
    }

    /// Sets how a call's arguments are read into the tool's types and fingerprinted (every
    /// field but the `#[arg(ignore)]` ones, defaults applied), for a tool without a key: its
    /// retry limit counts calls by that fingerprint, so spelling a default out, reordering
    /// fields or writing `5.0` for `5` is the same call. Without it (or when it gives `None`:
    /// an argument's type is not `Serialize`), calls are counted by the canonical form of their
    /// JSON. Generated code calls it.
    #[doc(hidden)]
    pub fn with_arguments_fingerprint(mut self, fingerprint: ArgumentsFingerprint) -> Self {
        self.arguments_fingerprint = Some(fingerprint);
        self
    }

    /// Declares an argument `#[arg(key = "case_insensitive")]`, by its name in the arguments'
    /// JSON: lowercased in the key.
    pub fn with_case_insensitive_argument(mut self, name: impl Into<String>) -> Self {
        self.case_insensitive_arguments.push(name.into());
        self
    }

    /// Declares that the parameter `field` is read from the arguments under `json_name`
    /// (`#[serde(rename = "..")]`). A key template names its fields as the fn does; what reads
    /// the arguments (the status check, the testing kit) finds them by
    /// [`key_arguments`](Self::key_arguments), in the JSON's spelling.
    ///
    /// ```
    /// use serde_json::json;
    /// use toolkey::{Story, ToolDefinition};
    ///
    /// let def = ToolDefinition::new("send_invoice", "Sends an invoice.", json!({}), Story::Idempotent)
    ///     .with_key_template("invoice:<customer>:<period>")
    ///     .with_renamed_argument("customer", "customer_id");
    /// assert_eq!(def.key_arguments(), ["customer_id", "period"]);
    /// ```
    pub fn with_renamed_argument(
        mut self,
        field: impl Into<String>,
        json_name: impl Into<String>,
    ) -> Self {
        self.renamed_arguments
            .push((field.into(), json_name.into()));
        self
    }

    /// Declares that the argument `name` (as the JSON names it) may also be given as `alias`
    /// (`#[serde(alias = "..")]`): a status call that gives it by its alias names it too.
    pub fn with_argument_alias(
        mut self,
        name: impl Into<String>,
        alias: impl Into<String>,
    ) -> Self {
        self.argument_aliases.push((name.into(), alias.into()));
        self
    }

    /// The names the arguments' JSON may give the argument `name`: `name`, then its aliases.
    pub(crate) fn names_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        let aliases = self.argument_aliases.iter();
        std::iter::once(name).chain(
            aliases
                .filter(move |(of, _)| of == name)
                .map(|(_, alias)| alias.as_str()),
        )
    }

    /// How serde reads each flattened parameter, in order: each type's schema derived once,
    /// for every check the toolbox makes of them.
    pub(crate) fn flattened_reads(&self) -> Vec<FlattenedRead<'_>> {
        (self.parameters.iter())
            .filter_map(|parameter| match parameter {
                Parameter::Own(_) => None,
                Parameter::Flattened {
                    name,
                    takes,
                    schema,
                } => Some(FlattenedRead::of(name, takes, schema())),
            })
            .collect()
    }

    /// A field of a flattened parameter that serde gives to another parameter first: (that
    /// name, the parameter that takes it). serde reads the parameters of their own first, then
    /// the flattened ones in order; a flattened struct, or an externally tagged enum, takes its
    /// fields away from those after it, an internally tagged enum or a map takes nothing away.
    /// Inside a flattened struct, its own fields come before the enum it flattens.
    pub(crate) fn shadowed_field(&self, reads: &[FlattenedRead<'_>]) -> Option<(String, String)> {
        let mut taken: Vec<(String, String)> = Vec::new();
        for parameter in &self.parameters {
            if let Parameter::Own(name) = parameter {
                taken.extend(self.names_of(name).map(|n| (n.to_string(), name.clone())));
            }
        }
        for read in reads {
            if let Some((field, by)) = taken.iter().find(|(n, _)| read.fields.contains(n)) {
                return Some((field.clone(), by.clone()));
            }
            if let Some(field) = read.shadowed_inside() {
                return Some((field, read.name.to_string()));
            }
            if read.takes_away {
                let fields = read.takes.iter().map(|f| f.to_string());
                let fields = fields.chain(read.fields.iter().cloned());
                taken.extend(fields.map(|f| (f, read.name.to_string())));
            }
        }
        None
    }

    /// The fields of a flattened enum without a tag (`#[serde(untagged)]`), if the arguments
    /// have one: serde reads the first of its branches that parses, whatever fields the call
    /// gave, and drops the fields that branch does not take.
    pub(crate) fn untagged_flattened(&self) -> Option<Vec<String>> {
        untagged_union(&self.input_schema, &self.input_schema, &mut Vec::new())
    }

    /// Declares that the tool needs `State<T>` from the toolbox.
    pub fn with_need(mut self, need: StateNeed) -> Self {
        self.needs.push(need);
        self
    }

    /// The tool's name, as the model calls it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The title, if any.
    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// What the tool does, from the fn's doc comment.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The canonical JSON Schema (2020-12) of the arguments.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    /// The JSON Schema of the result, if known.
    pub fn output_schema(&self) -> Option<&Value> {
        self.output_schema.as_ref()
    }

    /// The tool's story.
    pub fn story(&self) -> Story {
        self.story
    }

    /// The hints for clients.
    pub fn annotations(&self) -> Annotations {
        self.annotations
    }

    /// How the tool runs.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The name of the status companion, for keyed tools that have one.
    pub fn status_tool(&self) -> Option<&str> {
        self.status_tool.as_deref()
    }

    /// The key template of an `idempotent` tool, as written: `"invoice:<customer>:<period>"`.
    /// Its `<name>` placeholders (other than `<ctx.*>`) are the key's arguments.
    pub fn key_template(&self) -> Option<&str> {
        self.key_template.as_deref()
    }

    /// The arguments the key template names (`<ctx.*>` left out), as the arguments' JSON spells
    /// them: `["customer", "period"]` for `"invoice:<customer>:<period>"`, unless a field is
    /// renamed (see [`with_renamed_argument`](Self::with_renamed_argument)).
    pub fn key_arguments(&self) -> Vec<String> {
        let Some(template) = &self.key_template else {
            return Vec::new();
        };
        crate::key::placeholders(template)
            .filter(|name| !name.starts_with("ctx."))
            .map(|name| {
                let renamed = self
                    .renamed_arguments
                    .iter()
                    .find(|(field, _)| field == name);
                renamed.map_or(name, |(_, json)| json.as_str()).to_owned()
            })
            .collect()
    }

    /// The arguments marked `#[arg(ignore)]`: free text a retry may reword, left out of the
    /// fingerprint.
    pub fn ignored_arguments(&self) -> &[String] {
        &self.ignored_arguments
    }

    /// The arguments marked `#[arg(key = "case_insensitive")]`, as the arguments' JSON spells
    /// them: lowercased in the key.
    pub fn case_insensitive_arguments(&self) -> &[String] {
        &self.case_insensitive_arguments
    }

    /// The names the model-facing texts about this tool's calls use.
    pub(crate) fn named(&self) -> Named<'_> {
        Named {
            tool: &self.name,
            status: self.status_tool.as_deref(),
            per_call: self.key_follows_step(),
        }
    }
}

/// Reads a call's arguments into a tool's types and fingerprints them (see
/// [`ToolDefinition::with_arguments_fingerprint`]).
#[doc(hidden)]
pub type ArgumentsFingerprint = fn(&Value) -> Option<Fingerprint>;

/// What one call of a tool does, produced by [`Tool::prepare`] once its arguments are valid.
pub struct Call {
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) body: Body,
    pub(crate) recover: Option<Recover>,
    /// For a key on the call's place in the run: the key at one fixed place, under which (with
    /// the fingerprint) the retry limit counts the call's failures.
    pub(crate) limit_key: Option<IdempotencyKey>,
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
        }
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

/// The field names of the first union at or below `schema` (through `allOf`, unions and
/// `$ref`s, not properties) whose branches no tag tells apart: neither a `const` field in each
/// (an internally or adjacently tagged enum) nor one field of its own each (an externally
/// tagged one). A branch that takes no field (`{}`, beside a flattened `Option`'s) is none.
fn untagged_union<'a>(
    schema: &'a Value,
    whole: &'a Value,
    path: &mut Vec<&'a str>,
) -> Option<Vec<String>> {
    let map = schema.as_object()?;
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        if path.contains(&reference) {
            return None;
        }
        let target = crate::schema::walk::resolve(schema, whole)?;
        path.push(reference);
        let found = (["allOf", "anyOf", "oneOf"].iter())
            .filter_map(|keyword| target.get(*keyword)?.as_array())
            .flatten()
            .find_map(|branch| untagged_union(branch, whole, path));
        path.pop();
        if found.is_some() {
            return found;
        }
    }
    for branch in map
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(found) = untagged_union(branch, whole, path) {
            return Some(found);
        }
    }
    for keyword in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get(keyword) else {
            continue;
        };
        let lifted = fielded_branches(branches, whole);
        let tagged = lifted
            .iter()
            .all(|branch| branch.properties.values().any(|p| p.get("const").is_some()));
        if lifted.len() > 1 && !tagged && !one_field_of_its_own_each(&lifted) {
            let mut names: Vec<String> = Vec::new();
            for name in lifted.iter().flat_map(|branch| branch.properties.keys()) {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            return Some(names);
        }
        for branch in branches {
            if let Some(found) = untagged_union(branch, whole, path) {
                return Some(found);
            }
        }
    }
    None
}

/// True when `schema` (a type's own, at its root) takes `null`: `"type": [.., "null"]`, or a
/// union with a `{"type": "null"}` branch, as schemars writes an `Option`.
fn takes_null(schema: &Value) -> bool {
    let null = |ty: &Value| match ty {
        Value::String(ty) => ty == "null",
        Value::Array(types) => types.iter().any(|t| t == "null"),
        _ => false,
    };
    schema.get("type").is_some_and(null)
        || (["anyOf", "oneOf"].iter())
            .filter_map(|keyword| schema.get(*keyword)?.as_array())
            .flatten()
            .any(|branch| branch.get("type").is_some_and(null))
}

/// A flattened parameter that takes any field (a map, in a struct or a variant or not) and
/// would be given a field another flattened parameter reads: (the map's parameter, the
/// field, the parameter that reads it). serde gives such a parameter every field not taken
/// away before it, and takes none away itself.
pub(crate) fn map_takes_others_fields(
    reads: &[FlattenedRead<'_>],
) -> Option<(String, String, String)> {
    for (i, open) in reads.iter().enumerate().filter(|(_, r)| r.open) {
        for (j, other) in reads.iter().enumerate() {
            if j == i || (j < i && other.takes_away) {
                continue;
            }
            if let Some(field) = other.fields.first() {
                let (map, parameter) = (open.name.to_string(), other.name.to_string());
                return Some((map, field.clone(), parameter));
            }
        }
    }
    None
}

/// The name of a flattened parameter whose schema takes `null`: an `Option` the macro could
/// not see (behind a type alias), which serde reads as `None` when its fields do not parse.
pub(crate) fn flattened_option<'r>(reads: &'r [FlattenedRead<'_>]) -> Option<&'r str> {
    reads
        .iter()
        .find(|read| takes_null(&read.schema))
        .map(|read| read.name)
}

/// How serde reads one flattened parameter.
pub(crate) struct FlattenedRead<'a> {
    /// The parameter's name.
    name: &'a str,
    /// The names a struct reads by name, aliases included.
    takes: &'static [&'static str],
    /// Its schema.
    schema: Value,
    /// The fields its schema names, a flattened enum's branches' included.
    fields: Vec<String>,
    /// It takes its fields away from the parameters after it: a struct read field by field,
    /// or an externally tagged enum (its one entry).
    takes_away: bool,
    /// It takes any other field: a map, or a struct or branch holding one.
    open: bool,
}

impl<'a> FlattenedRead<'a> {
    fn of(name: &'a str, takes: &'static [&'static str], schema: Value) -> Self {
        let lifted = crate::schema::walk::lift(&schema, &schema);
        let open = lifted.open.is_some() || schema.get("patternProperties").is_some();
        FlattenedRead {
            name,
            takes,
            fields: lifted.properties.keys().cloned().collect(),
            takes_away: !takes.is_empty() || externally_tagged(&schema),
            open,
            schema,
        }
    }

    /// A field of an enum this parameter flattens that one of its own fields has: the struct
    /// takes it first.
    fn shadowed_inside(&self) -> Option<String> {
        let root = self.schema.as_object()?;
        let own = root.get("properties")?.as_object()?;
        let unions: serde_json::Map<String, Value> = (root.iter())
            .filter(|(keyword, _)| ["allOf", "anyOf", "oneOf"].contains(&keyword.as_str()))
            .map(|(keyword, branches)| (keyword.clone(), branches.clone()))
            .collect();
        let branches = crate::schema::walk::lift(&Value::Object(unions), &self.schema);
        own.keys()
            .find(|name| branches.properties.contains_key(*name))
            .cloned()
    }
}

/// True when `schema` is an externally tagged enum's: a union whose branches that take a field
/// each take one of their own, the variant's name, which serde takes away when it reads it (a
/// unit variant is a string, and takes none).
fn externally_tagged(schema: &Value) -> bool {
    ["anyOf", "oneOf"].iter().any(|keyword| {
        let Some(Value::Array(branches)) = schema.get(*keyword) else {
            return false;
        };
        let lifted = fielded_branches(branches, schema);
        !lifted.is_empty() && one_field_of_its_own_each(&lifted)
    })
}

/// The branches of a union lifted into one object each, those that take no field left out
/// (a unit variant's string, the `{}` beside a flattened `Option`'s).
fn fielded_branches(branches: &[Value], whole: &Value) -> Vec<crate::schema::walk::Lifted> {
    (branches.iter())
        .map(|branch| crate::schema::walk::lift(branch, whole))
        .filter(|lifted| !lifted.properties.is_empty())
        .collect()
}

/// True when each branch takes exactly one field, no two the same: an externally tagged
/// enum's, each variant's name.
fn one_field_of_its_own_each(branches: &[crate::schema::walk::Lifted]) -> bool {
    let mut seen: Vec<&String> = Vec::new();
    branches.iter().all(|branch| {
        let mut keys = branch.properties.keys();
        match (keys.next(), keys.next()) {
            (Some(only), None) if !seen.contains(&only) => {
                seen.push(only);
                true
            }
            _ => false,
        }
    })
}
