//! What every target shares: a toolbox over a counting store, the schemas that judge arguments,
//! a watchdog for hangs, and the checks on what a model reads back.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolkey::{ErrorCode, Story, ToolContext, ToolError, ToolOutput, Toolbox};

use crate::store::CountingStore;
use crate::tools::{self, Ledger};

/// An input that runs longer than this is a hang: the watchdog aborts the process and prints the
/// input's bytes. Generous, because a fuzzing machine may be shared and slow.
pub const HANG: Duration = Duration::from_secs(30);

/// What one tool accepts, as its schema says.
pub struct ToolInfo {
    /// The tool's name.
    pub name: String,
    /// Its story (a status companion is `read_only`).
    pub story: Story,
    /// True for a status companion.
    pub is_status: bool,
    /// The status companion's name, for keyed tools that have one.
    pub status_tool: Option<String>,
    /// The canonical input schema.
    pub schema: Value,
    /// The schema as written, formats checked (schemars's integer formats, `uint32` and the
    /// like, as the ranges they name): what a model is promised will be accepted.
    strict: jsonschema::Validator,
    /// The schema without `format` and `uniqueItems`: input it rejects is bad input that must be
    /// refused. (The parser may be kinder than the schema: a uuid without hyphens, a set with a
    /// repeated element mean one thing and are accepted; so does a nested struct given as the
    /// array of its fields in order, which serde's derive takes for any struct. A status
    /// companion accepts whatever its target's non-key fields hold, and ignores it.)
    lenient: jsonschema::Validator,
    /// Top-level parameters whose schema is a set (`uniqueItems`): their order means nothing.
    pub set_fields: Vec<String>,
}

impl ToolInfo {
    /// True when the schema, as written, accepts `args`.
    pub fn strictly_valid(&self, args: &Value) -> bool {
        self.strict.is_valid(args)
    }

    /// False when `args` is bad input by any reading of the schema.
    pub fn leniently_valid(&self, args: &Value) -> bool {
        self.lenient.is_valid(args)
    }

    /// True for tools whose calls may write to the store.
    pub fn keyed(&self) -> bool {
        !self.is_status && self.story == Story::Idempotent
    }
}

/// The toolbox, its store and its outside system, for one thread. Every input starts with
/// [`Fixture::with`], which empties it.
pub struct Fixture {
    /// The store under the toolbox, counting writes.
    pub store: Arc<CountingStore>,
    /// The fake outside system the bodies write to.
    pub ledger: Arc<Ledger>,
    /// The toolbox of [`tools`].
    pub toolbox: Toolbox,
    /// Every tool and status companion, by name.
    pub tools: HashMap<String, ToolInfo>,
    /// Tool names, in the toolbox's order.
    pub names: Vec<String>,
    /// Every parameter name of every tool: likely object keys for generated JSON.
    pub fields: Vec<String>,
    runtime: tokio::runtime::Runtime,
}

/// What a call did, besides its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// Store writes.
    pub writes: u64,
    /// Effects on the outside system.
    pub effects: usize,
}

impl Fixture {
    fn new() -> Self {
        let store = Arc::new(CountingStore::default());
        let ledger = Arc::new(Ledger::default());
        let toolbox = tools::toolbox(store.clone(), ledger.clone());
        let mut infos = HashMap::new();
        let mut names = Vec::new();
        let mut fields = Vec::new();
        let definitions = toolbox.definitions();
        let status_of: HashMap<&str, &str> = definitions
            .iter()
            .filter_map(|d| Some((d.status_tool()?, d.name())))
            .collect();
        for definition in definitions {
            let schema = definition.input_schema().clone();
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                fields.extend(properties.keys().cloned());
            }
            // A flattened enum's branches' fields too, two enums' under `allOf`.
            branch_fields(&schema, &mut fields);
            let set_fields = schema
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter(|(_, p)| p.get("uniqueItems") == Some(&Value::Bool(true)))
                .map(|(name, _)| name.clone())
                .collect();
            let mut bounded = schema.clone();
            bound_integer_formats(&mut bounded);
            let strict = jsonschema::options()
                .should_validate_formats(true)
                .build(&bounded)
                .expect("a tool's schema compiles");
            let is_status = status_of.contains_key(definition.name());
            let mut loose = schema.clone();
            strip(&mut loose, &["format", "uniqueItems"]);
            if let Some(Value::Object(defs)) = loose.get_mut("$defs") {
                defs.values_mut().for_each(allow_positional);
            }
            if is_status {
                free_optional_fields(&mut loose);
            }
            let lenient = jsonschema::validator_for(&loose).expect("a tool's schema compiles");
            let name = definition.name().to_string();
            names.push(name.clone());
            infos.insert(
                name.clone(),
                ToolInfo {
                    is_status,
                    status_tool: definition.status_tool().map(str::to_string),
                    story: definition.story(),
                    name,
                    schema,
                    strict,
                    lenient,
                    set_fields,
                },
            );
        }
        fields.sort();
        fields.dedup();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime");
        Fixture {
            store,
            ledger,
            toolbox,
            tools: infos,
            names,
            fields,
            runtime,
        }
    }

    /// Runs `f` with this thread's fixture, emptied first.
    pub fn with<R>(f: impl FnOnce(&Fixture) -> R) -> R {
        thread_local! {
            static FIXTURE: Fixture = Fixture::new();
        }
        FIXTURE.with(|fixture| {
            fixture.store.reset();
            fixture.ledger.reset();
            f(fixture)
        })
    }

    /// The context every call runs in.
    pub fn context() -> ToolContext {
        ToolContext::new("run-fuzz")
            .with_step(3)
            .with_tenant("tenant-fuzz")
    }

    /// Runs `fut` to its end and waits for every body it started; returns its answer and what it
    /// did to the store and the outside system. An answer that takes longer than [`HANG`] fails.
    pub fn observe<T>(&self, fut: impl Future<Output = T>) -> (T, Effects) {
        let writes = self.store.writes();
        let effects = self.ledger.count();
        let answer = self.runtime.block_on(async {
            let answer = tokio::time::timeout(HANG, fut)
                .await
                .unwrap_or_else(|_| panic!("hang: no answer within {HANG:?}"));
            let report = tokio::time::timeout(HANG, self.toolbox.shutdown())
                .await
                .unwrap_or_else(|_| panic!("hang: a body still runs after {HANG:?}"));
            assert!(
                report.is_clean(),
                "an outcome the store did not take: {report:?}"
            );
            answer
        });
        let done = Effects {
            writes: self.store.writes() - writes,
            effects: self.ledger.count() - effects,
        };
        (answer, done)
    }

    /// Calls a tool through [`Toolbox::call`].
    pub fn call(&self, name: &str, args: Value) -> (Result<ToolOutput, ToolError>, Effects) {
        let ctx = Self::context();
        self.observe(self.toolbox.call(name, args, &ctx))
    }
}

/// The names of the fields in the branches of `schema`'s unions, and of theirs.
fn branch_fields(schema: &Value, fields: &mut Vec<String>) {
    let branches = ["oneOf", "anyOf", "allOf"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_array))
        .flatten();
    for branch in branches {
        if let Some(properties) = branch.get("properties").and_then(Value::as_object) {
            fields.extend(properties.keys().cloned());
        }
        branch_fields(branch, fields);
    }
}

/// Lets the optional top-level fields of `schema` hold anything: a status companion's
/// non-key fields, which it accepts as they are and ignores; a flattened map's entries too.
fn free_optional_fields(schema: &mut Value) {
    if let Some(entries) = schema.get_mut("additionalProperties") {
        if entries.is_object() {
            *entries = Value::Bool(true);
        }
    }
    let required: Vec<Value> = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            if !required.contains(&Value::String(name.clone())) {
                *property = Value::Bool(true);
            }
        }
    }
}

/// Adds the range each of schemars's integer formats names (`"format": "uint32"`) as `minimum`
/// and `maximum`, which a validator checks: JSON Schema's formats apply to strings only.
fn bound_integer_formats(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let range = match map.get("format").and_then(Value::as_str) {
                Some("int8") => Some((i8::MIN as f64, i8::MAX as f64)),
                Some("int16") => Some((i16::MIN as f64, i16::MAX as f64)),
                Some("int32") => Some((i32::MIN as f64, i32::MAX as f64)),
                Some("int64" | "int") => Some((i64::MIN as f64, i64::MAX as f64)),
                Some("uint8") => Some((0.0, u8::MAX as f64)),
                Some("uint16") => Some((0.0, u16::MAX as f64)),
                Some("uint32") => Some((0.0, u32::MAX as f64)),
                Some("uint64" | "uint") => Some((0.0, u64::MAX as f64)),
                _ => None,
            };
            if let Some((min, max)) = range {
                map.entry("minimum").or_insert(Value::from(min));
                // `i64::MAX` and `u64::MAX` round up to a power of two as an `f64`, one past
                // the type's range: that bound is exclusive.
                let bound = if max > 4_294_967_295.0 {
                    "exclusiveMaximum"
                } else {
                    "maximum"
                };
                if !map.contains_key("maximum") {
                    map.entry(bound).or_insert(Value::from(max));
                }
            }
            map.values_mut().for_each(bound_integer_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integer_formats),
        _ => {}
    }
}

/// Lets a nested struct's schema (a `$defs` entry) be met by an array as well: serde's derived
/// `Deserialize` takes a struct's fields in order, and that is the user's type's rule, not
/// toolkey's. (A tool's own arguments must be an object.)
fn allow_positional(schema: &mut Value) {
    if schema.get("type") == Some(&Value::String("object".into())) {
        schema["type"] = serde_json::json!(["object", "array"]);
    }
}

/// Removes `keywords` from every schema object in `schema`.
fn strip(schema: &mut Value, keywords: &[&str]) {
    match schema {
        Value::Object(map) => {
            for keyword in keywords {
                map.remove(*keyword);
            }
            map.values_mut().for_each(|v| strip(v, keywords));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strip(v, keywords)),
        _ => {}
    }
}

/// Checks the error JSON a model reads: `{"error": {"code", "message", "retryable",
/// "suggestion"}}` with a non-empty code and message, nothing else.
pub fn check_error_json(json: &Value) {
    let Some(outer) = json.as_object() else {
        panic!("an error's JSON is not an object: {json}");
    };
    assert_eq!(outer.len(), 1, "an error's JSON has other fields: {json}");
    let error = json["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no `error` object: {json}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "retryable", "suggestion"],
        "{json}"
    );
    let code = error["code"].as_str().unwrap_or_default();
    assert!(
        !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
        "bad error code: {json}"
    );
    assert!(
        !error["message"].as_str().unwrap_or_default().is_empty(),
        "empty message: {json}"
    );
    assert!(error["retryable"].is_boolean(), "{json}");
    assert!(
        error["suggestion"].is_null() || error["suggestion"].is_string(),
        "{json}"
    );
}

/// Checks that an `INVALID_ARGUMENTS` answer is clear (with a suggestion that says what to do;
/// it is retryable or not as the same arguments could succeed or not) and that the call did
/// nothing.
pub fn check_invalid(err: &ToolError, done: Effects, what: &str) {
    assert!(err.is(ErrorCode::InvalidArguments), "{what}: {err:?}");
    assert!(
        err.suggestion().is_some_and(|s| !s.is_empty()),
        "{what}: INVALID_ARGUMENTS without a suggestion: {err:?}"
    );
    assert_eq!(done.writes, 0, "{what}: {err:?} after {done:?}");
    assert_eq!(done.effects, 0, "{what}: {err:?} after {done:?}");
}

/// An answer's size is bounded by its input's: no error message or result repeats the input
/// without limit.
pub fn check_size(answer: &str, input_len: usize) {
    let bound = 4 * input_len + 16 * 1024;
    assert!(
        answer.len() <= bound,
        "an answer of {} bytes for {input_len} bytes of input: {}...",
        answer.len(),
        answer.chars().take(400).collect::<String>()
    );
}

/// Counts of what one target did, printed when it ends.
#[derive(Default)]
pub struct Tally {
    /// Inputs run.
    pub inputs: AtomicU64,
    /// Calls answered `INVALID_ARGUMENTS` (or the provider's error for a malformed call).
    pub refused: AtomicU64,
    /// Calls that ran or replayed (for the fingerprint target: values fingerprinted).
    pub accepted: AtomicU64,
    /// Calls answered with another error (`CONFLICT`, a tool's own, `UNKNOWN_TOOL`, ...).
    pub other: AtomicU64,
    /// Those other errors, by code.
    pub codes: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Tally {
    /// Counts one input.
    pub fn input(&self) {
        self.inputs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one call by its answer.
    pub fn answer<T>(&self, result: &Result<T, ToolError>) {
        self.code(result.as_ref().err().map(ToolError::code));
    }

    /// Counts one answer by its error code (`None` for a result).
    pub fn code(&self, code: Option<&str>) {
        let counter = match code {
            None => &self.accepted,
            Some(code) if code == ErrorCode::InvalidArguments.as_str() => &self.refused,
            Some(other) => {
                *self.codes.lock().unwrap().entry(other.into()).or_default() += 1;
                &self.other
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// One line for the test's output.
    pub fn summary(&self, target: &str) -> String {
        let codes: Vec<String> = self
            .codes
            .lock()
            .unwrap()
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        format!(
            "fuzz {target}: {} inputs; answers: {} ok, {} INVALID_ARGUMENTS, {} other errors ({}); 0 failures",
            self.inputs.load(Ordering::Relaxed),
            self.accepted.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
            codes.join(", "),
        )
    }
}

/// Runs `f` on `input` under the watchdog: if it has not returned after [`HANG`], the process
/// prints the input (hex) and aborts, since a hang cannot be caught and reported by the engine.
pub fn guarded<R>(target: &'static str, input: &[u8], f: impl FnOnce() -> R) -> R {
    struct Running {
        since: Instant,
        target: &'static str,
        input: Vec<u8>,
    }
    static RUNNING: OnceLock<Mutex<HashMap<u64, Running>>> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static SLOT: Cell<Option<u64>> = const { Cell::new(None) };
    }
    let running = RUNNING.get_or_init(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(1));
            let map = RUNNING.get().expect("set").lock().unwrap();
            for entry in map.values() {
                if entry.since.elapsed() > HANG {
                    let hex: String = entry.input.iter().map(|b| format!("{b:02x}")).collect();
                    eprintln!(
                        "fuzz {}: hang: an input ran over {HANG:?}; its bytes: {hex}",
                        entry.target
                    );
                    std::process::abort();
                }
            }
        });
        Mutex::new(HashMap::new())
    });
    let slot = SLOT.with(|slot| {
        slot.get().unwrap_or_else(|| {
            let id = NEXT.fetch_add(1, Ordering::Relaxed);
            slot.set(Some(id));
            id
        })
    });
    running.lock().unwrap().insert(
        slot,
        Running {
            since: Instant::now(),
            target,
            input: input.to_vec(),
        },
    );
    struct Done(u64);
    impl Drop for Done {
        fn drop(&mut self) {
            if let Some(map) = RUNNING.get() {
                if let Ok(mut map) = map.lock() {
                    map.remove(&self.0);
                }
            }
        }
    }
    let _done = Done(slot);
    f()
}
