//! Golden files of every export of the catalog tools: what each provider receives, reviewed as
//! a diff whenever it changes. Regenerate with
//! `TOOLKEY_BLESS=1 cargo test -p toolkey-tests --test export_golden` and read the diff before
//! committing it. And the order of properties: the order the parameters are declared in, in
//! every export.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolkey::{tool, Fingerprint, Tool, ToolDefinition, ToolError};
use toolkey_tests::catalog;

fn check(profile: &str, export: impl Fn(&ToolDefinition) -> Value) {
    let tools: Vec<Value> = catalog::toolbox()
        .definitions()
        .iter()
        .map(export)
        .collect();
    let actual = serde_json::to_string_pretty(&Value::Array(tools)).unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(format!("{profile}.json"));
    if std::env::var_os("TOOLKEY_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with TOOLKEY_BLESS=1 to write it",
            path.display()
        )
    });
    if expected != actual {
        let (line, (want, got)) = expected
            .lines()
            .chain(std::iter::repeat(""))
            .zip(actual.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (want, got))| want != got)
            .expect("the texts differ somewhere");
        panic!(
            "the {profile} export differs from {} at line {}:\n  golden: {want}\n  now:    {got}\n\
             if the change is intended, run TOOLKEY_BLESS=1 cargo test -p toolkey-tests --test export_golden and review the diff",
            path.display(),
            line + 1
        );
    }
}

#[test]
fn canonical() {
    check(
        "canonical",
        |def| serde_json::json!({"name": def.name(), "input_schema": def.input_schema(), "output_schema": def.output_schema()}),
    );
}

#[test]
fn openai_chat_completions() {
    check("openai", ToolDefinition::to_openai);
}

#[test]
fn openai_responses() {
    check("openai_responses", ToolDefinition::to_openai_responses);
}

#[test]
fn anthropic() {
    check("anthropic", ToolDefinition::to_anthropic);
}

#[test]
fn gemini() {
    check("gemini", ToolDefinition::to_gemini);
}

#[test]
fn mcp() {
    check("mcp", ToolDefinition::to_mcp);
}

/// A nested value whose fields are not in alphabetical order either.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Inner {
    /// Last letter first.
    zulu: String,
    /// Then the first.
    alpha: u32,
}

/// Parameters declared out of alphabetical order.
#[tool(read_only)]
async fn ordered(
    /// Declared first.
    zeta: String,
    /// Declared second.
    alpha: i64,
    /// Declared third, optional.
    mid: Option<bool>,
    /// Declared last.
    inner: Inner,
) -> Result<(), ToolError> {
    let _ = (zeta, alpha, mid, inner);
    Ok(())
}

fn names(value: &Value) -> Vec<&str> {
    match value {
        Value::Object(map) => map.keys().map(String::as_str).collect(),
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => panic!("neither properties nor required: {value}"),
    }
}

#[test]
fn properties_and_required_keep_the_declared_order_in_every_export() {
    let def = Ordered.definition();
    let inner = |schema: &Value| -> Value {
        let property = &schema["properties"]["inner"];
        match property.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.rsplit('/').next().unwrap();
                schema["$defs"][name].clone()
            }
            None => property.clone(),
        }
    };
    let openai = def.to_openai()["function"]["parameters"].clone();
    let exports = [
        (
            "canonical",
            def.input_schema().clone(),
            vec!["zeta", "alpha", "inner"],
        ),
        ("openai", openai, vec!["zeta", "alpha", "mid", "inner"]),
        (
            "openai_responses",
            def.to_openai_responses()["parameters"].clone(),
            vec!["zeta", "alpha", "mid", "inner"],
        ),
        (
            "anthropic",
            def.to_anthropic()["input_schema"].clone(),
            vec!["zeta", "alpha", "inner"],
        ),
        (
            "gemini",
            def.to_gemini()["parameters"].clone(),
            vec!["zeta", "alpha", "inner"],
        ),
        (
            "mcp",
            def.to_mcp()["inputSchema"].clone(),
            vec!["zeta", "alpha", "inner"],
        ),
    ];
    for (profile, schema, required) in exports {
        assert_eq!(
            names(&schema["properties"]),
            ["zeta", "alpha", "mid", "inner"],
            "{profile}: {schema}"
        );
        assert_eq!(names(&schema["required"]), required, "{profile}: {schema}");
        let inner = inner(&schema);
        assert_eq!(
            names(&inner["properties"]),
            ["zulu", "alpha"],
            "{profile}: {inner}"
        );
        assert_eq!(
            names(&inner["required"]),
            ["zulu", "alpha"],
            "{profile}: {inner}"
        );
    }
}

#[derive(Serialize)]
struct Args {
    zeta: &'static str,
    alpha: i64,
    mid: bool,
}

#[test]
fn fingerprints_do_not_depend_on_the_order_values_keep() {
    // The arguments serialize in declaration order now; fingerprints hash the canonical text,
    // whose keys are sorted, so a fingerprint stored before is the fingerprint computed now:
    // the SHA-256 of `{"alpha":1,"mid":true,"zeta":"z"}`.
    let declared = serde_json::to_value(Args {
        zeta: "z",
        alpha: 1,
        mid: true,
    })
    .unwrap();
    assert_eq!(names(&declared), ["zeta", "alpha", "mid"]);
    let sorted_text = "c43fd46cbc32af1e482c7b6e97a2e507066db6e40afff4525aa61cf7846ae9fd";
    assert_eq!(Fingerprint::of(&declared).unwrap().to_hex(), sorted_text);
    let reordered = json!({"mid": true, "alpha": 1, "zeta": "z"});
    assert_eq!(Fingerprint::of(&reordered).unwrap().to_hex(), sorted_text);
}
