use super::*;
use serde_json::json;

fn args(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn shipping_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "order": {"type": "string"},
            "shipping": {"$ref": "#/$defs/Shipping"},
            "contact": {"anyOf": [{"$ref": "#/$defs/Contact"}, {"type": "null"}]},
            "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "additionalProperties": false,
        "$defs": {
            "Shipping": {
                "type": "object",
                "properties": {"express": {"type": ["boolean", "null"]}},
                "additionalProperties": false
            },
            "Contact": {"anyOf": [
                {"type": "object", "properties": {"email": {"type": "string"}},
                 "required": ["email"], "additionalProperties": false},
                {"type": "object", "properties": {"phone": {"type": "string"},
                 "cc": {"type": ["string", "null"]}}, "required": ["phone"],
                 "additionalProperties": false}
            ]},
            "Line": {
                "type": "object",
                "properties": {"sku": {"type": "string"},
                               "parts": {"type": "array", "items": {"$ref": "#/$defs/Line"}}},
                "additionalProperties": false
            }
        }
    })
}

#[test]
fn only_fields_holding_a_closed_object_are_checked() {
    let nested = Nested::of(&shipping_schema()).unwrap();
    let checked: Vec<&str> = nested.fields.keys().map(String::as_str).collect();
    assert_eq!(checked, ["contact", "lines", "shipping"]);
    let flat = json!({"type": "object", "properties": {"order": {"type": "string"}}});
    assert!(Nested::of(&flat).is_none());
}

#[test]
fn a_field_no_form_takes_is_refused_where_it_is() {
    let nested = Nested::of(&shipping_schema()).unwrap();
    let ok = args(
        json!({"order": "o", "shipping": {"express": true}, "contact": null,
        "lines": [{"sku": "a", "parts": [{"sku": "b"}]}], "labels": {"any": "x"}}),
    );
    assert_eq!(nested.check(&ok), Ok(()));
    let refused = nested
        .check(&args(json!({"shipping": {"expres": true}})))
        .unwrap_err();
    assert_eq!(refused.path, "shipping");
    assert_eq!(refused.field, "shipping.expres");
    assert_eq!(
        refused.problem,
        "unknown field `expres`, expected one of `express`"
    );
    let deep = args(json!({"lines": [{"sku": "a"}, {"sku": "b", "parts": [{"skus": "c"}]}]}));
    let refused = nested.check(&deep).unwrap_err();
    assert_eq!(refused.field, "lines[1].parts[0].skus");
}

#[test]
fn fields_of_two_branches_do_not_go_together() {
    let nested = Nested::of(&shipping_schema()).unwrap();
    for one in [json!({"email": "a@b"}), json!({"phone": "1", "cc": "44"})] {
        assert_eq!(nested.check(&args(json!({ "contact": one }))), Ok(()));
    }
    let both = json!({"contact": {"email": "a@b", "phone": "1", "cc": "44"}});
    let refused = nested.check(&args(both)).unwrap_err();
    assert_eq!(refused.path, "contact");
    assert!(
        refused
            .problem
            .starts_with("field `email` does not go with"),
        "{}",
        refused.problem
    );
    let unknown = json!({"contact": {"fax": "1"}});
    let refused = nested.check(&args(unknown)).unwrap_err();
    assert_eq!(
        refused.problem,
        "unknown field `fax`, expected one of `cc`, `email`, `phone`"
    );
}

#[test]
fn a_tag_chooses_the_form() {
    let schema = json!({
        "type": "object",
        "properties": {"pay": {"$ref": "#/$defs/Pay"}},
        "$defs": {"Pay": {"oneOf": [
            {"type": "object", "properties": {"method": {"type": "string", "const": "card"},
             "last4": {"type": "string"}}, "additionalProperties": false},
            {"type": "object", "properties": {"method": {"type": "string", "const": "bank"},
             "iban": {"type": "string"}}, "additionalProperties": false}
        ]}}
    });
    let nested = Nested::of(&schema).unwrap();
    let card = args(json!({"pay": {"method": "card", "last4": "4242"}}));
    assert_eq!(nested.check(&card), Ok(()));
    let mixed = args(json!({"pay": {"method": "card", "iban": "DE00"}}));
    let refused = nested.check(&mixed).unwrap_err();
    assert_eq!(
        refused.problem,
        "unknown field `iban`, expected one of `last4`, `method`"
    );
}

#[test]
fn what_the_check_does_not_read_takes_anything() {
    let schema = json!({
        "type": "object",
        "properties": {
            "open": {"type": "object", "properties": {"a": {"type": "string"}}},
            "all": {"allOf": [{"$ref": "#/$defs/Closed"}]},
            "any": {},
            "loop": {"$ref": "#/$defs/Loop"}
        },
        "$defs": {
            "Closed": {"type": "object", "properties": {}, "additionalProperties": false},
            "Loop": {"$ref": "#/$defs/Loop"}
        }
    });
    assert!(Nested::of(&schema).is_none());
}

/// Arguments serde writes are taken, whatever shapes their types have: each kind of enum,
/// maps, options, arrays, a recursive type, a flattened field inside a nested struct, and
/// renamed fields.
#[test]
fn what_serde_writes_is_taken() {
    use schemars::JsonSchema;
    use serde::Serialize;
    use std::collections::HashMap;

    #[derive(Serialize, JsonSchema)]
    struct Card {
        last4: String,
    }
    #[derive(Serialize, JsonSchema)]
    #[serde(tag = "method", rename_all = "snake_case")]
    enum Internal {
        Card(Card),
        Bank { iban: String },
        Cash,
    }
    #[derive(Serialize, JsonSchema)]
    #[serde(tag = "t", content = "c")]
    enum Adjacent {
        Unit,
        Pair(u8, u8),
        Named { x: u8 },
    }
    #[derive(Serialize, JsonSchema)]
    enum External {
        Unit,
        Wrapped(Card),
        Named { x: Option<u8> },
    }
    #[derive(Serialize, JsonSchema)]
    #[serde(untagged)]
    enum Untagged {
        Count { n: u32, unit: String },
        Text(String),
        Many(Vec<Card>),
    }
    #[derive(Serialize, JsonSchema)]
    struct Tree {
        name: String,
        children: Vec<Tree>,
        parent: Option<Box<Tree>>,
    }
    #[derive(Serialize, JsonSchema)]
    struct WithFlattened {
        id: u8,
        #[serde(flatten)]
        how: Internal,
        #[serde(flatten)]
        rest: HashMap<String, String>,
    }
    #[derive(Serialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    struct Renamed {
        gift_wrap: bool,
        #[serde(rename = "SKU")]
        sku: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    }
    #[derive(Serialize, JsonSchema)]
    struct Args {
        internal: Vec<Internal>,
        adjacent: Vec<Adjacent>,
        external: Vec<External>,
        untagged: Vec<Untagged>,
        tree: Tree,
        flattened: WithFlattened,
        renamed: Option<Renamed>,
        by_name: HashMap<String, Option<Card>>,
        tuple: (Card, u8),
        any: Value,
    }
    let leaf = |name: &str| Tree {
        name: name.into(),
        children: vec![],
        parent: None,
    };
    let card = || Card {
        last4: "4242".into(),
    };
    let args = Args {
        internal: vec![
            Internal::Card(card()),
            Internal::Bank {
                iban: "DE00".into(),
            },
            Internal::Cash,
        ],
        adjacent: vec![
            Adjacent::Unit,
            Adjacent::Pair(1, 2),
            Adjacent::Named { x: 3 },
        ],
        external: vec![
            External::Unit,
            External::Wrapped(card()),
            External::Named { x: None },
        ],
        untagged: vec![
            Untagged::Count {
                n: 2,
                unit: "kg".into(),
            },
            Untagged::Text("t".into()),
            Untagged::Many(vec![card()]),
        ],
        tree: Tree {
            name: "root".into(),
            children: vec![Tree {
                name: "a".into(),
                children: vec![leaf("b")],
                parent: Some(Box::new(leaf("root"))),
            }],
            parent: None,
        },
        flattened: WithFlattened {
            id: 1,
            how: Internal::Card(card()),
            rest: HashMap::from([("extra".into(), "yes".into())]),
        },
        renamed: Some(Renamed {
            gift_wrap: true,
            sku: "a".into(),
            note: None,
        }),
        by_name: HashMap::from([("a".into(), Some(card())), ("b".into(), None)]),
        tuple: (card(), 1),
        any: json!({"whatever": [1, {"x": 2}]}),
    };
    let schema = crate::schema::schema_for::<Args>();
    let nested = Nested::of(&schema).expect("closed objects below the top");
    let value = serde_json::to_value(&args).unwrap();
    assert_eq!(nested.check(value.as_object().unwrap()), Ok(()));
    // And a field no form takes is still seen, deep in the recursive type.
    let mut wrong = value.clone();
    wrong["tree"]["children"][0]["children"][0]["nam"] = json!("x");
    let refused = nested.check(wrong.as_object().unwrap()).unwrap_err();
    assert_eq!(refused.field, "tree.children[0].children[0].nam");
    let mut wrong = value;
    wrong["internal"][0]["iban"] = json!("DE00");
    let refused = nested.check(wrong.as_object().unwrap()).unwrap_err();
    assert_eq!(refused.field, "internal[0].iban");
}

/// More shapes serde writes: transparent and boxed structs, options of arrays and arrays of
/// options, sets of structs, maps keyed by numbers, `#[serde(other)]`, a struct that denies
/// unknown fields itself, defaults, and a field whose schema is written by hand.
#[test]
fn what_serde_writes_in_other_shapes_is_taken() {
    use schemars::JsonSchema;
    use serde::Serialize;
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
    struct Tag {
        name: String,
    }
    #[derive(Serialize, JsonSchema)]
    #[serde(transparent)]
    struct Wrapper(Tag);
    #[derive(Serialize, JsonSchema)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Kind {
        Known {
            tag: Tag,
        },
        #[serde(other)]
        Unknown,
    }
    #[derive(Serialize, JsonSchema, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Strict {
        a: u8,
        b: Option<Tag>,
    }
    fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "object"})
    }
    #[derive(Serialize, JsonSchema)]
    struct Args {
        wrapped: Wrapper,
        boxed: Box<Tag>,
        maybe_many: Option<Vec<Tag>>,
        many_maybe: Vec<Option<Tag>>,
        set: BTreeSet<Tag>,
        by_number: BTreeMap<u32, Tag>,
        kinds: Vec<Kind>,
        strict: Strict,
        #[schemars(schema_with = "free_form")]
        free: Value,
        pair: (Tag, u8),
    }
    let tag = |n: &str| Tag { name: n.into() };
    let args = Args {
        wrapped: Wrapper(tag("w")),
        boxed: Box::new(tag("b")),
        maybe_many: Some(vec![tag("m")]),
        many_maybe: vec![None, Some(tag("x"))],
        set: BTreeSet::from([tag("s"), tag("t")]),
        by_number: BTreeMap::from([(7, tag("seven"))]),
        kinds: vec![Kind::Known { tag: tag("k") }, Kind::Unknown],
        strict: Strict { a: 1, b: None },
        free: json!({"anything": {"at": "all"}}),
        pair: (tag("p"), 1),
    };
    let schema = crate::schema::schema_for::<Args>();
    let nested = Nested::of(&schema).expect("closed objects below the top");
    let value = serde_json::to_value(&args).unwrap();
    assert_eq!(nested.check(value.as_object().unwrap()), Ok(()));
    for (at, wrong) in [
        ("wrapped", json!({"name": "w", "nam": 1})),
        ("boxed", json!({"nme": "b"})),
        ("maybe_many", json!([{"name": "m"}, {"names": "n"}])),
        ("many_maybe", json!([null, {"name": "x", "x": 1}])),
        ("set", json!([{"name": "s", "other": true}])),
        ("by_number", json!({"7": {"name": "seven", "n": 7}})),
        (
            "kinds",
            json!([{"kind": "known", "tag": {"name": "k", "extra": 1}}]),
        ),
        ("pair", json!([{"name": "p", "nmae": "q"}, 1])),
    ] {
        let mut call = value.clone();
        call[at] = wrong;
        assert!(
            nested.check(call.as_object().unwrap()).is_err(),
            "{at}: refused"
        );
    }
    // A tag no variant holds is read by serde as the `other` variant, the fields beside it
    // dropped: refused, as the schema refuses it.
    let mut call = value;
    call["kinds"] = json!([{"kind": "whatever", "tag": {"name": "k"}}]);
    let refused = nested.check(call.as_object().unwrap()).unwrap_err();
    assert_eq!(refused.field, "kinds[0].kind");
    assert_eq!(
        refused.problem,
        "field `kind` holds \"whatever\", which no form of it takes: expected one of \"known\", \"unknown\""
    );
}

/// A type that names itself twice (a binary tree) is read once, not once per level: read
/// again at each level, it doubled the reading per level until the budget ran out, and
/// every field read after that, the tree's and the other parameters', was taken unchecked.
#[test]
fn a_type_that_names_itself_twice_is_read_once() {
    use schemars::JsonSchema;
    use serde::Serialize;

    #[derive(Serialize, JsonSchema)]
    struct Node {
        v: u8,
        left: Option<Box<Node>>,
        right: Option<Box<Node>>,
    }
    #[derive(Serialize, JsonSchema)]
    struct Card {
        last4: String,
    }
    #[derive(Serialize, JsonSchema)]
    struct Args {
        a_tree: Node,
        z_card: Card,
    }
    let schema = crate::schema::schema_for::<Args>();
    let nested = Nested::of(&schema).unwrap();
    assert!(nested.shapes.len() < 16, "{} shapes", nested.shapes.len());
    let mut deep = json!({"v": 0, "left": null, "rigth": null});
    for v in 1..14 {
        deep = json!({"v": v, "left": deep, "right": null});
    }
    for (args, field) in [
        (
            json!({"a_tree": {"v": 1, "left": null, "right": null},
                   "z_card": {"last4": "1", "lst4": "2"}}),
            "z_card.lst4",
        ),
        (
            json!({"a_tree": {"v": 1, "left": {"v": 2, "rigth": null}}, "z_card": {"last4": "1"}}),
            "a_tree.left.rigth",
        ),
        (
            json!({"a_tree": deep, "z_card": {"last4": "1"}}),
            "a_tree.left.left.left.left.left.left.left.left.left.left.left.left.left.rigth",
        ),
    ] {
        let refused = nested.check(args.as_object().unwrap()).unwrap_err();
        assert_eq!(refused.field, field);
    }
}

/// A schema written by hand in the older style (`definitions`, `#/definitions/Name`, a
/// name escaped as a JSON pointer) is read as schemars's is: the check found no definition
/// there and took anything.
#[test]
fn a_schema_with_definitions_is_read_as_one_with_defs() {
    let schema = json!({
        "type": "object",
        "properties": {
            "to": {"$ref": "#/definitions/Address"},
            "via": {"anyOf": [{"$ref": "#/definitions/a~1b"}, {"type": "null"}]}
        },
        "definitions": {
            "Address": {"type": "object", "properties": {"city": {"type": "string"}},
                        "additionalProperties": false},
            "a/b": {"type": "object", "properties": {"hub": {"type": "string"}},
                    "additionalProperties": false}
        }
    });
    let nested = Nested::of(&schema).expect("closed objects below the top");
    let ok = args(json!({"to": {"city": "Oslo"}, "via": {"hub": "x"}}));
    assert_eq!(nested.check(&ok), Ok(()));
    let refused = nested
        .check(&args(json!({"to": {"cty": "Oslo"}})))
        .unwrap_err();
    assert_eq!(refused.field, "to.cty");
    let refused = nested
        .check(&args(json!({"via": {"hubb": "x"}})))
        .unwrap_err();
    assert_eq!(refused.field, "via.hubb");
}
