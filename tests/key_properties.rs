//! Properties of key derivation and fingerprints, over random templates, values and
//! representations (proptest, 10,000 cases each).
//!
//! - Injectivity: for any template the macro accepts, two argument tuples that differ after
//!   normalization never give one key, and two that are equal after it always do.
//! - Fingerprints: equal arguments give equal fingerprints, whatever order a set's items or a
//!   map's entries came in; different arguments give different ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use proptest::prelude::*;
use serde_json::{json, Value};
use toolkey::__private::KeyBuilder;
use toolkey::{tool, State, Tool, ToolContext, ToolError};

const CASES: u32 = 10_000;

/// Literal text a template may hold between placeholders (never `\`, `#`, `<`, `>`, controls).
const LITERAL: &[char] = &['a', 'x', 'X', '1', ':', '-', '/', '.', '_', ' ', 'é', '$'];
/// Characters values are made of: the literal characters, the reserved ones, and case pairs.
const VALUE: &[char] = &[
    'a', 'A', 'x', 'X', '1', ':', '-', '/', '.', '\\', '#', '<', '>', ' ', 'é', 'É', '$', 'b',
];

#[derive(Debug, Clone)]
struct Template {
    prefix: String,
    /// The literal after each placeholder (the last one may be empty).
    after: Vec<String>,
    /// Per placeholder: `#[arg(key = "case_insensitive")]`.
    fold: Vec<bool>,
    hash: bool,
}

fn chars(alphabet: &'static [char], len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(alphabet), len)
        .prop_map(|cs| cs.into_iter().collect())
}

fn template() -> impl Strategy<Value = Template> {
    (1usize..5).prop_flat_map(|n| {
        (
            chars(LITERAL, 1..4).prop_map(|p| format!("ns{p}")),
            prop::collection::vec(chars(LITERAL, 1..3), n),
            chars(LITERAL, 0..3),
            prop::collection::vec(any::<bool>(), n),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(prefix, mut after, last, fold, hash)| {
                *after.last_mut().expect("n >= 1") = last;
                Template {
                    prefix,
                    after,
                    fold,
                    hash,
                }
            })
    })
}

fn leak(text: &str) -> &'static str {
    Box::leak(text.to_string().into_boxed_str())
}

impl Template {
    /// The characters values escape: those of the literal text after the namespace, as the
    /// macro computes them.
    fn specials(&self) -> &'static str {
        let mut cs: Vec<char> = self.after.iter().flat_map(|l| l.chars()).collect();
        cs.sort_unstable();
        cs.dedup();
        leak(&cs.into_iter().collect::<String>())
    }

    fn key(&self, values: &[String]) -> String {
        let (prefix, specials) = (leak(&self.prefix), self.specials());
        let mut k = if self.hash {
            KeyBuilder::hashed(prefix, specials)
        } else {
            KeyBuilder::new(prefix, specials)
        };
        for ((value, after), fold) in values.iter().zip(&self.after).zip(&self.fold) {
            if *fold {
                k.part_case_insensitive(value.as_str(), "field");
            } else {
                k.part(value.as_str(), "field");
            }
            k.literal(leak(after));
        }
        k.finish()
            .expect("no control characters")
            .as_str()
            .to_string()
    }

    /// The tuple as the key means it: trimmed, and case-folded where the placeholder folds case.
    fn normalized(&self, values: &[String]) -> Vec<String> {
        values
            .iter()
            .zip(&self.fold)
            .map(|(v, fold)| {
                let v = v.trim();
                if *fold {
                    unicase::UniCase::new(v).to_folded_case()
                } else {
                    v.to_string()
                }
            })
            .collect()
    }
}

/// A template and several tuples for it, some of them made to collide: a value's tail moved
/// into the next value across the literal text between them.
fn template_and_tuples() -> impl Strategy<Value = (Template, Vec<Vec<String>>)> {
    template().prop_flat_map(|t| {
        let n = t.after.len();
        let tuple = prop::collection::vec(chars(VALUE, 0..5), n);
        (Just(t), prop::collection::vec(tuple, 2..12))
    })
}

fn forged(t: &Template, values: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for i in 0..values.len().saturating_sub(1) {
        // "1x2","3" -> "1","2x3" and back: what literal text between two parts invites.
        let (a, b) = (&values[i], &values[i + 1]);
        let sep = &t.after[i];
        let joined = format!("{a}{sep}{b}");
        for cut in 0..=joined.len() {
            if !joined.is_char_boundary(cut) {
                continue;
            }
            let mut v = values.to_vec();
            v[i] = joined[..cut].to_string();
            v[i + 1] = joined[cut..].to_string();
            out.push(v);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn distinct_normalized_tuples_never_share_a_key((t, tuples) in template_and_tuples()) {
        let mut all = tuples.clone();
        for tuple in &tuples {
            all.extend(forged(&t, tuple));
        }
        let mut seen: HashMap<String, Vec<String>> = HashMap::new();
        for values in &all {
            let key = t.key(values);
            let normalized = t.normalized(values);
            if let Some(before) = seen.insert(key.clone(), normalized.clone()) {
                prop_assert_eq!(&before, &normalized, "one key {} for two tuples, template {:?}", key, t);
            }
        }
        // And the converse: equal after normalization is one key.
        for values in &tuples {
            let padded: Vec<String> = values.iter().map(|v| format!(" {v} ")).collect();
            prop_assert_eq!(t.key(values), t.key(&padded));
        }
    }
}

/// The outside world of `label`: nothing but a count.
#[derive(Default)]
struct Shelf;

/// Labels a parcel: sets and maps of sets, in any order the model sends them.
#[tool(idempotent(key = "label:<parcel>", status = false))]
async fn label(
    _shelf: State<Shelf>,
    parcel: String,
    tags: HashSet<String>,
    sorted_tags: BTreeSet<i32>,
    routes: HashMap<String, HashSet<u16>>,
    stops: Vec<u16>,
    limits: BTreeMap<u32, Vec<i8>>,
) -> Result<(), ToolError> {
    let _ = (parcel, tags, sorted_tags, routes, stops, limits);
    Ok(())
}

#[derive(Debug, Clone)]
struct Args {
    tags: BTreeSet<String>,
    sorted_tags: BTreeSet<i32>,
    routes: BTreeMap<String, BTreeSet<u16>>,
    stops: Vec<u16>,
    limits: BTreeMap<u32, Vec<i8>>,
}

fn args() -> impl Strategy<Value = Args> {
    (
        prop::collection::btree_set("[a-c]{0,3}", 0..6),
        prop::collection::btree_set(-3i32..3, 0..5),
        prop::collection::btree_map(
            "[a-b]{1,2}",
            prop::collection::btree_set(0u16..6, 0..4),
            0..4,
        ),
        prop::collection::vec(0u16..4, 0..4),
        prop::collection::btree_map(0u32..4, prop::collection::vec(-2i8..2, 0..3), 0..3),
    )
        .prop_map(|(tags, sorted_tags, routes, stops, limits)| Args {
            tags,
            sorted_tags,
            routes,
            stops,
            limits,
        })
}

impl Args {
    /// The JSON a model might send for these arguments, with every set's items and every map's
    /// entries in the order `order` picks (lists keep theirs: their order means something).
    fn json(&self, order: &mut impl FnMut(usize) -> usize) -> Value {
        fn shuffled<T: Clone>(items: Vec<T>, order: &mut impl FnMut(usize) -> usize) -> Vec<T> {
            let mut items = items;
            for i in (1..items.len()).rev() {
                items.swap(i, order(i + 1));
            }
            items
        }
        let tags = shuffled(self.tags.iter().cloned().collect(), order);
        let sorted_tags = shuffled(self.sorted_tags.iter().copied().collect(), order);
        let mut routes = serde_json::Map::new();
        for (k, v) in shuffled(self.routes.clone().into_iter().collect(), order) {
            routes.insert(k, json!(shuffled(v.into_iter().collect(), order)));
        }
        let mut limits = serde_json::Map::new();
        for (k, v) in shuffled(self.limits.clone().into_iter().collect(), order) {
            limits.insert(k.to_string(), json!(v));
        }
        json!({
            "routes": routes, "parcel": "p-1", "tags": tags, "sorted_tags": sorted_tags,
            "stops": self.stops, "limits": limits,
        })
    }

    fn same(&self, other: &Args) -> bool {
        self.tags == other.tags
            && self.sorted_tags == other.sorted_tags
            && self.routes == other.routes
            && self.stops == other.stops
            && self.limits == other.limits
    }
}

fn fingerprint(args: Value) -> toolkey::Fingerprint {
    let ctx = ToolContext::new("run");
    *Label
        .prepare(&args, &ctx)
        .expect("valid arguments")
        .fingerprint()
        .expect("keyed")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn equal_arguments_have_one_fingerprint_in_any_representation(
        a in args(),
        b in args(),
        seed_one in any::<u64>(),
        seed_two in any::<u64>(),
    ) {
        let picker = |mut seed: u64| move |bound: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % bound
        };
        let one = fingerprint(a.json(&mut picker(seed_one)));
        let two = fingerprint(a.json(&mut picker(seed_two)));
        prop_assert_eq!(one, two);
        let other = fingerprint(b.json(&mut picker(seed_two)));
        prop_assert_eq!(a.same(&b), one == other, "{:?} vs {:?}", a, b);
    }
}
