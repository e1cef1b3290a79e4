//! Golden files of every export of the catalog tools: what each provider receives, reviewed as
//! a diff whenever it changes. Regenerate with `TOOLKEY_BLESS=1 cargo test -p toolkey-tests --test export_golden`
//! and read the diff before committing it.

mod catalog;
mod common;

use std::path::PathBuf;

use serde_json::Value;
use toolkey::ToolDefinition;

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
