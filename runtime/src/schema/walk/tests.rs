use super::*;

#[test]
fn a_branch_inside_a_branch_that_may_not_close_stays_open() {
    // A flattened `Option` of an enum: `anyOf` of its `oneOf` and `{}`, beside the root's
    // own properties, which every branch sees too.
    let mut schema = json!({
        "type": "object",
        "properties": {"order": {"type": "string"}},
        "anyOf": [
            {"oneOf": [{"type": "object", "properties": {"last4": {"type": "string"}}}]},
            {}
        ]
    });
    close_objects(&mut schema);
    let branch = &schema["anyOf"][0]["oneOf"][0];
    assert!(branch.get("additionalProperties").is_none(), "{schema:#}");
}

#[test]
fn top_level_unions_nested_or_not_become_one_object_their_tags_one_enum() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"order": {"type": "string"}},
        "required": ["order"],
        "oneOf": [
            {"type": "object", "properties": {"method": {"type": "string", "const": "card"}, "last4": {"type": "string"}}, "required": ["method", "last4"]},
            {"type": "object", "properties": {"method": {"type": "string", "const": "bank"}, "iban": {"type": "string"}}, "required": ["method", "iban"]}
        ],
        "unevaluatedProperties": false
    });
    let lifted = without_top_level_unions(&schema);
    assert_eq!(
        lifted,
        json!({
            "type": "object",
            "properties": {
                "order": {"type": "string"},
                "method": {"type": "string", "enum": ["card", "bank"]},
                "last4": {"type": "string"},
                "iban": {"type": "string"}
            },
            "required": ["order", "method"],
            "additionalProperties": false
        })
    );
    let mut properties = Object::new();
    unite_property(&mut properties, "n", &json!({"type": "integer"}));
    unite_property(&mut properties, "n", &json!({"type": "string"}));
    unite_property(&mut properties, "n", &json!({"type": "string"}));
    assert_eq!(
        properties["n"],
        json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})
    );
}

#[test]
fn two_flattened_enums_lift_into_one_object_and_a_recursive_ref_is_read_once() {
    // Two flattened enums: an `allOf` of two `oneOf`s, one branch a `$ref`.
    let schema = json!({
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
        "allOf": [
            {"oneOf": [
                {"$ref": "#/$defs/Card"},
                {"type": "object", "properties": {"method": {"type": "string", "const": "bank"}, "iban": {"type": "string"}}, "required": ["method", "iban"]}
            ]},
            {"oneOf": [
                {"type": "object", "properties": {"speed": {"type": "string", "const": "instant"}, "fee": {"type": "integer"}}, "required": ["speed", "fee"]},
                {"type": "object", "properties": {"speed": {"type": "string", "const": "standard"}}, "required": ["speed"]}
            ]}
        ],
        "$defs": {"Card": {"type": "object", "properties": {"method": {"type": "string", "const": "card"}, "last4": {"type": "string"}}, "required": ["method", "last4"]}},
        "unevaluatedProperties": false
    });
    let lifted = without_top_level_unions(&schema);
    assert_eq!(
        lifted["properties"],
        json!({
            "id": {"type": "string"},
            "method": {"type": "string", "enum": ["card", "bank"]},
            "last4": {"type": "string"},
            "iban": {"type": "string"},
            "speed": {"type": "string", "enum": ["instant", "standard"]},
            "fee": {"type": "integer"}
        }),
        "{lifted:#}"
    );
    assert_eq!(lifted["required"], json!(["id", "method", "speed"]));
    assert_eq!(lifted["additionalProperties"], json!(false));
    // A type that refers to itself through its branches is read once on each path.
    let recursive = json!({
        "anyOf": [{"$ref": "#/$defs/Tree"}, {"$ref": "#/$defs/Tree"}],
        "$defs": {"Tree": {
            "properties": {"leaf": {"type": "string"}},
            "anyOf": [{"$ref": "#/$defs/Tree"}, {"$ref": "#/$defs/Tree"}]
        }}
    });
    let lifted = lift(&recursive, &recursive);
    assert_eq!(
        lifted.properties,
        json!({"leaf": {"type": "string"}})
            .as_object()
            .cloned()
            .unwrap()
    );
}

#[test]
fn a_ref_beside_properties_is_merged_with_them_before_closing() {
    // An internally tagged newtype variant: its tag beside its type's `$ref`.
    let mut schema = json!({
        "properties": {"other": {"$ref": "#/$defs/Card"}},
        "oneOf": [{
            "$ref": "#/$defs/Card",
            "type": "object",
            "properties": {"method": {"type": "string", "const": "card"}},
            "required": ["method"]
        }],
        "$defs": {"Card": {"type": "object", "properties": {"last4": {"type": "string"}}, "required": ["last4"]}}
    });
    merge_refs_beside_properties(&mut schema);
    assert_eq!(
        schema["oneOf"][0],
        json!({
            "type": "object",
            "properties": {"method": {"type": "string", "const": "card"}, "last4": {"type": "string"}},
            "required": ["method", "last4"]
        })
    );
    // A bare `$ref` stays, and so does what it names.
    assert_eq!(
        schema["properties"]["other"],
        json!({"$ref": "#/$defs/Card"})
    );
    assert!(schema["$defs"].get("Card").is_some());
}

#[test]
fn closes_plain_objects_but_not_composed_ones() {
    let mut schema = json!({
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "string"}}},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "flat": {
                "type": "object",
                "properties": {"y": {"type": "string"}},
                "oneOf": [{"properties": {"k": {"const": "one"}}}]
            }
        }
    });
    close_objects(&mut schema);
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
    assert_eq!(
        schema["properties"]["map"]["additionalProperties"],
        json!({"type": "string"})
    );
    assert!(schema["properties"]["flat"]
        .get("additionalProperties")
        .is_none());
    assert!(schema["properties"]["flat"]["oneOf"][0]
        .get("additionalProperties")
        .is_none());
}

#[test]
fn inlines_refs_with_siblings_and_keeps_recursion_finite() {
    let mut schema = json!({
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/Node", "description": "the field"},
            "b": {"$ref": "#/$defs/Node"}
        },
        "$defs": {"Node": {
            "type": "object",
            "description": "the type",
            "properties": {"next": {"$ref": "#/$defs/Node", "description": "next one"}}
        }}
    });
    inline_refs(&mut schema, Inline::WithSiblings);
    prune_defs(&mut schema);
    let a = &schema["properties"]["a"];
    assert_eq!(a["description"], "the field");
    assert_eq!(a["properties"]["next"], json!({"$ref": "#/$defs/Node"}));
    assert_eq!(schema["properties"]["b"], json!({"$ref": "#/$defs/Node"}));
    assert!(schema["$defs"].get("Node").is_some());

    inline_refs(&mut schema, Inline::All);
    schema.as_object_mut().unwrap().shift_remove("$defs");
    let text = schema.to_string();
    assert!(!text.contains("$ref"), "{text}");
    assert_eq!(
        schema["properties"]["b"]["properties"]["next"]["type"],
        "object"
    );
}

#[test]
fn prunes_only_unreferenced_definitions() {
    let mut schema = json!({
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"items": {"$ref": "#/$defs/B"}}, "B": {}, "C": {}}
    });
    prune_defs(&mut schema);
    let names: Vec<&String> = schema["$defs"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["A", "B"]);
}

#[test]
fn merges_compatible_all_of_and_refuses_conflicts() {
    let mut ok = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
    ]});
    assert!(merge_all_of(ok.as_object_mut().unwrap()));
    assert_eq!(ok["required"], json!(["a", "b"]));
    assert!(ok.get("allOf").is_none());

    let mut conflict = json!({"allOf": [{"type": "object"}, {"type": "string"}]});
    assert!(!merge_all_of(conflict.as_object_mut().unwrap()));
    assert!(conflict.get("allOf").is_some());
}

#[test]
fn strips_null_from_unions() {
    let mut a = json!({"type": ["string", "null"], "description": "d"});
    strip_null(&mut a);
    assert_eq!(a, json!({"type": "string", "description": "d"}));
    let mut b = json!({"anyOf": [{"$ref": "#/$defs/X"}, {"type": "null"}], "description": "d"});
    strip_null(&mut b);
    assert_eq!(b, json!({"$ref": "#/$defs/X", "description": "d"}));
    assert!(accepts_null(
        &json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
    ));
    assert!(!accepts_null(
        &json!({"type": ["string", "null"], "enum": ["a"]})
    ));
}
