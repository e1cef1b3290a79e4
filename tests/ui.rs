//! Compile-time checks of `#[tool]`: each file in `ui/fail` holds one mistake and its expected
//! diagnostic; each file in `ui/pass` holds accepted forms. Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p toolkey-tests --test ui` and read every diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
