//! The `Tool` trait the `#[tool]` attribute implements, and a tool's definition.

use std::any::TypeId;

use serde_json::Value;

use crate::story::{Annotations, Story};
use crate::texts::Named;
use crate::{Fingerprint, ToolError};

// The call's side of a tool.
mod call;
// How serde reads flattened parameters.
mod flatten;
// Settings and retry limits.
mod settings;
// The bodies of transactional calls.
mod transaction;

pub use call::{Body, BoxFuture, Call, Invocation, KeyFn, Recover, StatusCompanion, Tool};
pub(crate) use flatten::{flattened_option, map_takes_others_fields};
pub(crate) use settings::DEFAULT_RETRY_LIMIT;
pub use settings::{RetryLimit, Settings};
pub(crate) use transaction::Inner as TxInner;
pub use transaction::TxBody;

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
    /// The database whose transaction a transactional tool's body writes in.
    pub(crate) transaction: Option<crate::store::Database>,
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
            transaction: None,
        }
    }

    /// Declares the tool transactional on `database`: its calls' bodies
    /// ([`Call::with_transaction`]) write in the transaction that holds their key's record. A
    /// toolbox whose store keeps its records elsewhere refuses the tool when it is built.
    pub fn with_transaction(mut self, database: crate::store::Database) -> Self {
        self.transaction = Some(database);
        self
    }

    /// The database a transactional tool writes in; `None` for every other tool.
    pub fn transaction(&self) -> Option<crate::store::Database> {
        self.transaction
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
