//! The exports of every catalog tool against each provider's rules, and the canonical schemas
//! against the JSON Schema 2020-12 meta-schema.

mod openai_rules;

use serde_json::{json, Value};
use toolkey::{Story, ToolDefinition};
use toolkey_tests::catalog;

fn definitions() -> Vec<ToolDefinition> {
    catalog::toolbox().definitions().to_vec()
}

fn validator(schema: &Value, what: &str) -> jsonschema::Validator {
    jsonschema::draft202012::new(schema)
        .unwrap_or_else(|e| panic!("{what} does not compile: {e}\n{schema:#}"))
}

fn assert_valid(schema: &Value, instance: &Value, what: &str) {
    let errors: Vec<String> = validator(schema, what)
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} refuses {instance}: {errors:#?}\n{schema:#}"
    );
}

/// True when the arguments take fields of any name beside their own: a `#[serde(flatten)]` map,
/// which strict mode cannot express.
fn takes_any_field(def: &ToolDefinition) -> bool {
    def.input_schema()["additionalProperties"].is_object()
}

#[test]
fn every_openai_export_passes_the_strict_mode_rules() {
    let mut open = Vec::new();
    for def in definitions() {
        for tool in [def.to_openai(), def.to_openai_responses()] {
            let mut found = openai_rules::violations(&tool);
            if takes_any_field(&def) {
                // Exported as it is, not strict, but still without a top-level union.
                open.push(def.name().to_string());
                let not_strict = [
                    "`strict` is not true",
                    "#: an object without `additionalProperties: false`",
                ];
                found.retain(|v| !not_strict.contains(&v.as_str()));
                let parameters = tool.get("function").unwrap_or(&tool)["parameters"].clone();
                assert_eq!(parameters["type"], "object", "{tool:#}");
            }
            assert!(
                found.is_empty(),
                "`{}` breaks strict mode: {found:#?}\n{tool:#}",
                def.name()
            );
        }
    }
    open.sort();
    open.dedup();
    assert_eq!(open, ["label_order", "labels_status"]);
}

#[test]
fn the_rule_checker_finds_what_strict_mode_refuses() {
    // OpenAI's own example of a strict tool passes.
    let weather = json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Fetches the weather in the given location",
        "strict": true,
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The location to get the weather for"},
                "unit": {"type": ["string", "null"], "description": "The unit to return the temperature in", "enum": ["F", "C"]}
            },
            "additionalProperties": false,
            "required": ["location", "unit"]
        }
    }});
    assert_eq!(openai_rules::violations(&weather), Vec::<String>::new());

    // The canonical schema of `create_shipment`, sent as it is, breaks every rule it can.
    let canonical = catalog::toolbox()
        .definition("create_shipment")
        .unwrap()
        .input_schema()
        .clone();
    let raw = json!({"type": "function", "function": {
        "name": "create_shipment", "description": "d", "strict": true, "parameters": canonical
    }});
    let found = openai_rules::violations(&raw).join("\n");
    for expected in [
        "`$schema` is not supported",
        "`oneOf` is not supported",
        "`$ref` has sibling keywords",
        "format `uint32` is not supported",
        "`required` is",
    ] {
        assert!(
            found.contains(expected),
            "the checker missed {expected:?} in:\n{found}"
        );
    }
    let open = json!({"type": "function", "function": {"name": "o", "description": "d", "strict": true, "parameters": {
        "type": "object",
        "properties": {"nested": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}},
        "required": ["nested"],
        "additionalProperties": false
    }}});
    assert_eq!(
        openai_rules::violations(&open),
        ["#/properties/nested: an object without `additionalProperties: false`"]
    );
    let defaults = catalog::toolbox()
        .definition("search_orders")
        .unwrap()
        .input_schema()
        .clone();
    let raw = json!({"type": "function", "function": {"name": "s", "description": "d", "strict": true, "parameters": defaults}});
    assert!(openai_rules::violations(&raw)
        .join("\n")
        .contains("`default` is not supported"));
}

#[test]
fn strict_schemas_take_nulls_for_optional_fields_and_the_full_arguments() {
    for def in definitions() {
        let parameters = &def.to_openai()["function"]["parameters"];
        let what = format!("the strict schema of `{}`", def.name());
        assert_valid(parameters, &catalog::strict_arguments(def.name()), &what);
        let canonical = def.input_schema();
        // Where a flattened enum's branches spread over the arguments, no one call gives every
        // field (its strict arguments give the other branch's as `null`), nor does a status
        // call that takes such a call's arguments.
        let arguments = catalog::arguments(def.name());
        let every_field = canonical["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(name, _)| arguments.get(name).is_some());
        let branches = ["oneOf", "allOf"]
            .iter()
            .any(|k| canonical.get(*k).is_some());
        if !branches && every_field {
            assert_valid(parameters, &arguments, &what);
        }
        let optional = canonical["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(name, _)| {
                !canonical["required"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(name))
            });
        for (name, _) in optional {
            // The full arguments, and `null` for what they cannot give beside the rest.
            let mut arguments = catalog::arguments(def.name());
            for (other, _) in parameters["properties"].as_object().into_iter().flatten() {
                if arguments.get(other).is_none() {
                    arguments[other] = Value::Null;
                }
            }
            arguments[name] = Value::Null;
            assert_valid(
                parameters,
                &arguments,
                &format!("{what} with `{name}: null`"),
            );
        }
    }
}

#[test]
fn canonical_schemas_are_valid_json_schema_2020_12() {
    for def in definitions() {
        let mut schemas = vec![("input", def.input_schema().clone())];
        schemas.extend(def.output_schema().map(|s| ("output", s.clone())));
        for (which, schema) in schemas {
            let what = format!("the {which} schema of `{}`", def.name());
            if let Err(e) = jsonschema::draft202012::meta::validate(&schema) {
                panic!("{what} is not valid 2020-12: {e}\n{schema:#}");
            }
            assert_eq!(
                schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
                "{what}"
            );
            assert!(
                schema.get("title").is_none(),
                "{what} keeps the Rust type's name as title"
            );
            validator(&schema, &what);
        }
        let input = def.input_schema();
        assert_eq!(input["type"], "object");
        // Closed: by `additionalProperties`, or, beside a flattened enum's branches (those of
        // two enums under `allOf`), by `unevaluatedProperties`; a flattened map says what the
        // other fields hold instead.
        let closed = if ["oneOf", "allOf"].iter().any(|k| input.get(*k).is_some()) {
            &input["unevaluatedProperties"]
        } else {
            &input["additionalProperties"]
        };
        assert!(
            closed == &json!(false) || takes_any_field(&def),
            "`{}` is not closed",
            def.name()
        );
        assert_valid(
            input,
            &catalog::arguments(def.name()),
            &format!("the input schema of `{}`", def.name()),
        );
    }
}

#[test]
fn nested_objects_of_the_canonical_schema_are_closed() {
    let def = catalog::toolbox()
        .definition("create_shipment")
        .unwrap()
        .clone();
    let schema = def.input_schema();
    assert_eq!(schema["$defs"]["Address"]["additionalProperties"], false);
    assert_eq!(schema["$defs"]["LineItem"]["additionalProperties"], false);
    assert_eq!(
        schema["$defs"]["Notify"]["oneOf"][0]["additionalProperties"],
        false
    );
    let mut extra = catalog::arguments("create_shipment");
    extra["address"]["floor"] = json!(3);
    assert!(!validator(schema, "create_shipment").is_valid(&extra));
}

/// The keywords of Gemini's schema object (an OpenAPI 3.0 subset).
const GEMINI: &[&str] = &[
    "type",
    "nullable",
    "description",
    "enum",
    "properties",
    "required",
    "items",
    "anyOf",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minProperties",
    "maxProperties",
    "default",
];

fn check_gemini(schema: &Value, at: &str, found: &mut Vec<String>) {
    let Some(map) = schema.as_object() else {
        found.push(format!("{at}: not a schema object"));
        return;
    };
    for keyword in map.keys() {
        if !GEMINI.contains(&keyword.as_str()) {
            found.push(format!("{at}: `{keyword}`"));
        }
    }
    if map.get("type").is_some_and(|t| !t.is_string()) {
        found.push(format!("{at}: `type` is not one type name"));
    }
    if map
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|vs| vs.iter().any(|v| !v.is_string()))
    {
        found.push(format!("{at}: an enum value that is not a string"));
    }
    if map
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.is_empty())
    {
        found.push(format!("{at}: an object with empty `properties`"));
    }
    for (name, property) in map
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        check_gemini(property, &format!("{at}/{name}"), found);
    }
    if let Some(items) = map.get("items") {
        check_gemini(items, &format!("{at}/items"), found);
    }
    for (i, branch) in map
        .get("anyOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        check_gemini(branch, &format!("{at}/anyOf/{i}"), found);
    }
}

#[test]
fn gemini_declarations_stay_inside_the_openapi_subset() {
    for def in definitions() {
        let declaration = def.to_gemini();
        let mut keys: Vec<&String> = declaration.as_object().unwrap().keys().collect();
        keys.sort();
        match declaration.get("parameters") {
            None => {
                assert_eq!(keys, ["description", "name"]);
                assert!(def
                    .input_schema()
                    .get("properties")
                    .is_none_or(|p| p.as_object().unwrap().is_empty()));
            }
            Some(parameters) => {
                assert_eq!(keys, ["description", "name", "parameters"]);
                assert_eq!(parameters["type"], "object");
                let mut found = Vec::new();
                check_gemini(parameters, "#", &mut found);
                assert!(
                    found.is_empty(),
                    "`{}` has keywords Gemini refuses: {found:#?}\n{parameters:#}",
                    def.name()
                );
            }
        }
    }
}

#[test]
fn anthropic_input_schemas_are_objects_without_top_level_unions() {
    for def in definitions() {
        let tool = def.to_anthropic();
        let schema = &tool["input_schema"];
        assert_eq!(tool["name"], def.name());
        assert_eq!(schema["type"], "object");
        for keyword in ["oneOf", "anyOf", "allOf", "$schema"] {
            assert!(
                schema.get(keyword).is_none(),
                "`{}` has top-level `{keyword}`",
                def.name()
            );
        }
        assert_valid(
            schema,
            &catalog::arguments(def.name()),
            &format!("the Anthropic schema of `{}`", def.name()),
        );
    }
}

#[test]
fn mcp_tools_have_object_schemas_and_annotations_from_the_story() {
    for def in definitions() {
        let tool = def.to_mcp();
        let what = format!("the MCP tool `{}`", def.name());
        assert_eq!(tool["inputSchema"]["type"], "object", "{what}");
        assert_valid(&tool["inputSchema"], &catalog::arguments(def.name()), &what);
        match def.output_schema() {
            Some(output) if output["type"] == "object" => {
                assert_eq!(tool["outputSchema"]["type"], "object", "{what}")
            }
            _ => assert!(
                tool.get("outputSchema").is_none(),
                "{what} has a non-object output schema"
            ),
        }
        assert!(
            !tool["inputSchema"].to_string().contains("\"null\""),
            "{what} keeps a null union: {tool:#}"
        );
        let hints = &tool["annotations"];
        let expected = match def.story() {
            Story::ReadOnly => [true, false, true],
            Story::Idempotent => [false, def.annotations().destructive, true],
            Story::Natural => [false, false, true],
            Story::Unkeyed => [false, true, false],
        };
        assert_eq!(
            [
                &hints["readOnlyHint"],
                &hints["destructiveHint"],
                &hints["idempotentHint"]
            ],
            expected.map(Value::Bool).each_ref(),
            "{what}"
        );
        assert_eq!(hints["openWorldHint"], true, "{what}");
    }
    let shipment = catalog::toolbox()
        .definition("create_shipment")
        .unwrap()
        .to_mcp();
    assert_eq!(
        shipment["annotations"]["destructiveHint"], false,
        "`destructive = false` reaches MCP"
    );
}

/// Pays out to a payee given as one field, not flattened.
#[toolkey::tool(idempotent(key = "payto:<id>"))]
async fn pay_to(id: String, to: catalog::PayTo) -> Result<String, toolkey::ToolError> {
    Ok(format!("{id}:{to:?}"))
}

/// An internally tagged enum's newtype variant (`Card(CardRef)`) has its tag beside its type's
/// `$ref`. Before, the type was closed on its own, which forbade the tag: the canonical schema
/// refused every card, and OpenAI's strict export inlined the type without its fields. Every
/// export now takes a card, and the tool runs it.
#[tokio::test]
async fn a_newtype_variants_tag_and_fields_go_together_in_every_export() {
    let toolbox = toolkey::Toolbox::builder().tool(PayTo).build().unwrap();
    let def = toolbox.definition("pay_to").unwrap();
    let card = json!({"id": "p-1", "to": {"method": "card", "last4": "4242"}});
    assert_valid(def.input_schema(), &card, "the canonical schema");
    let openai = &def.to_openai()["function"]["parameters"];
    assert_valid(openai, &card, "the strict schema");
    assert_valid(
        &def.to_anthropic()["input_schema"],
        &card,
        "the Anthropic schema",
    );
    assert_valid(&def.to_mcp()["inputSchema"], &card, "the MCP schema");
    let bare = json!({"id": "p-1", "to": {"method": "card"}});
    assert!(
        !validator(openai, "the strict schema").is_valid(&bare),
        "a card without its digits"
    );
    let out = toolbox
        .call("pay_to", card, &toolkey::ToolContext::new("run-1"))
        .await
        .unwrap();
    assert_eq!(out.value, json!("p-1:Card(CardRef { last4: \"4242\" })"));
}
