//! The runtime's modules point one way: `runtime/src/lib.rs` declares them from the bottom up,
//! and each may use only itself and those declared before it. A use is read by the module that
//! defines the name, not the root's re-export: `use crate::ToolError` is a use of `error`.
//! Test code (`#[cfg(test)]`) and doc links are not uses.
//!
//! `cargo test -p toolkey-tests --test layers` prints the order and every use against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::{Attribute, Item, UseTree};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src")
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// True for `#[cfg(test)]`, and any `cfg` that holds `test` (`all(test, ...)`).
fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr.meta.require_list().is_ok_and(|list| {
                list.tokens
                    .clone()
                    .into_iter()
                    .any(|t| matches!(&t, TokenTree::Ident(i) if i == "test"))
            })
    })
}

/// The runtime's top modules in the order `lib.rs` declares them, each with its files, and the
/// module each name the root re-exports is defined in.
struct Crate {
    order: Vec<String>,
    files: BTreeMap<String, Vec<PathBuf>>,
    reexports: BTreeMap<String, String>,
}

impl Crate {
    fn read() -> Crate {
        let lib = parse(&src().join("lib.rs"));
        let mut order = Vec::new();
        let mut files = BTreeMap::new();
        let mut reexports = BTreeMap::new();
        for item in &lib.items {
            match item {
                Item::Mod(module) if !is_test(&module.attrs) => {
                    let name = module.ident.to_string();
                    let explicit = module.attrs.iter().find_map(|attr| {
                        let syn::Meta::NameValue(nv) = &attr.meta else {
                            return None;
                        };
                        let syn::Expr::Lit(lit) = &nv.value else {
                            return None;
                        };
                        let syn::Lit::Str(path) = &lit.lit else {
                            return None;
                        };
                        attr.path().is_ident("path").then(|| path.value())
                    });
                    let mut found = Vec::new();
                    match explicit {
                        Some(path) => found.push(src().join(path)),
                        None => {
                            let file = src().join(format!("{name}.rs"));
                            if file.exists() {
                                found.push(file);
                            }
                            collect(&src().join(&name), &mut found);
                        }
                    }
                    assert!(!found.is_empty(), "no file for module `{name}`");
                    files.insert(name.clone(), found);
                    order.push(name);
                }
                Item::Use(reexport) => {
                    let mut leaves = Vec::new();
                    leaves_of(&reexport.tree, &mut Vec::new(), &mut leaves);
                    for (path, name) in leaves {
                        if let Some(module) = path.first() {
                            reexports.insert(name, module.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        // A `#[macro_export]` macro lands at the crate's root whatever module defines it: it is
        // named `crate::the_macro`, and belongs to the module that defines it.
        for (module, paths) in &files {
            for path in paths {
                for item in parse(path).items {
                    if let Item::Macro(mac) = item {
                        let exported = mac.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                        if let (true, Some(name)) = (exported, mac.ident) {
                            reexports.insert(name.to_string(), module.clone());
                        }
                    }
                }
            }
        }
        Crate {
            order,
            files,
            reexports,
        }
    }

    /// The top module `name` (the first segment after `crate::`) stands for.
    fn module_of(&self, name: &str) -> Option<&str> {
        if self.files.contains_key(name) {
            return Some(self.files.get_key_value(name).unwrap().0);
        }
        self.reexports.get(name).map(String::as_str)
    }
}

fn collect(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The leaves of a `use` tree: each path to a name, and the name.
fn leaves_of(tree: &UseTree, path: &mut Vec<String>, into: &mut Vec<(Vec<String>, String)>) {
    match tree {
        UseTree::Path(p) => {
            path.push(p.ident.to_string());
            leaves_of(&p.tree, path, into);
            path.pop();
        }
        UseTree::Name(n) => into.push((path.clone(), n.ident.to_string())),
        UseTree::Rename(r) => into.push((path.clone(), r.ident.to_string())),
        UseTree::Glob(_) => into.push((path.clone(), "*".into())),
        UseTree::Group(g) => g.items.iter().for_each(|t| leaves_of(t, path, into)),
    }
}

/// The first segment after `crate::` of every path in `tokens` (macro bodies and attributes
/// included), and after as many `super::` as lead out of the file's module to the root.
fn crate_names(tokens: TokenStream, depth: usize, into: &mut Vec<String>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let is =
        |i: usize, word: &str| matches!(tokens.get(i), Some(TokenTree::Ident(id)) if id == word);
    let colons = |i: usize| {
        matches!(tokens.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':')
            && matches!(tokens.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':')
    };
    let mut i = 0;
    while i < tokens.len() {
        if let TokenTree::Group(group) = &tokens[i] {
            crate_names(group.stream(), depth, into);
            i += 1;
            continue;
        }
        // The start of a path: not a segment of one before it.
        let starts = i < 2 || !colons(i - 2);
        let mut at = None;
        if starts && is(i, "crate") && colons(i + 1) {
            at = Some(i + 3);
        } else if starts && is(i, "super") {
            let mut j = i;
            let mut ups = 0;
            while is(j, "super") && colons(j + 1) {
                ups += 1;
                j += 3;
            }
            if ups >= depth {
                at = Some(j);
            }
        }
        if let Some(at) = at {
            match tokens.get(at) {
                Some(TokenTree::Ident(name)) => into.push(name.to_string()),
                Some(TokenTree::Group(group)) => {
                    // `crate::{a, b::c}`: each branch's first segment.
                    let mut first = true;
                    for token in group.stream() {
                        match &token {
                            TokenTree::Ident(name) if first => {
                                into.push(name.to_string());
                                first = false;
                            }
                            TokenTree::Punct(p) if p.as_char() == ',' => first = true,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
}

/// How deep a file's module stands below the root: `texts.rs` and `store/mod.rs` 1,
/// `store/sqlite.rs` 2.
fn depth(file: &Path) -> usize {
    let rel = file.strip_prefix(src()).unwrap();
    let parts = rel.components().count();
    if rel.file_name().is_some_and(|n| n == "mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// The files of modules declared `#[cfg(test)] mod name;`: test code, not uses.
fn test_files(krate: &Crate) -> Vec<PathBuf> {
    let mut tests = Vec::new();
    for file in krate.files.values().flatten() {
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        for item in parse(file).items {
            if let Item::Mod(module) = item {
                if module.content.is_none() && is_test(&module.attrs) {
                    let name = module.ident.to_string();
                    tests.push(dir.join(format!("{name}.rs")));
                    collect(&dir.join(&name), &mut tests);
                }
            }
        }
    }
    tests
}

/// Every use against the order, one line each.
fn violations(krate: &Crate) -> Vec<String> {
    let place = |m: &str| krate.order.iter().position(|o| o == m).unwrap();
    let tests = test_files(krate);
    let mut found = Vec::new();
    for (module, files) in &krate.files {
        for file in files.iter().filter(|f| !tests.contains(f)) {
            let mut names = Vec::new();
            for item in parse(file).items {
                let attrs = match &item {
                    Item::Mod(m) => &m.attrs,
                    Item::Fn(f) => &f.attrs,
                    Item::Impl(i) => &i.attrs,
                    Item::Use(u) => &u.attrs,
                    _ => &Vec::new(),
                };
                if is_test(attrs) {
                    continue;
                }
                crate_names(
                    quote::ToTokens::to_token_stream(&item),
                    depth(file),
                    &mut names,
                );
            }
            names.sort();
            names.dedup();
            for name in names {
                let Some(used) = krate.module_of(&name) else {
                    panic!(
                        "{}: `crate::{name}` is neither a module nor a re-export of lib.rs",
                        file.display()
                    );
                };
                if place(used) > place(module) {
                    let rel = file.strip_prefix(src()).unwrap().display();
                    found.push(format!(
                        "`{module}` ({rel}) uses `{used}` (`crate::{name}`), declared above it"
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn every_module_uses_only_those_declared_before_it() {
    let krate = Crate::read();
    println!("layers, from the bottom up: {}", krate.order.join(" < "));
    let found = violations(&krate);
    println!(
        "layer check: {} modules, {} uses against the order",
        krate.order.len(),
        found.len()
    );
    assert!(
        found.is_empty(),
        "runtime/src/lib.rs declares its modules from the bottom up; these uses point up:\n{}",
        found.join("\n")
    );
}
