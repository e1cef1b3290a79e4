//! What the macro writes, checked without compiling it: the expansion snapshot of the design's
//! `send_invoice` (regenerate with `UPDATE_EXPECT=1 cargo test -p toolkey-macros`, and read the
//! diff), and the `crate = "..."` override reaching every generated path.

use proc_macro2::TokenStream;
use quote::quote;

fn send_invoice(args: TokenStream) -> TokenStream {
    let item = quote! {
        /// Create and send the invoice for one customer and billing period.
        ///
        /// Safe to retry: a second call for the same customer and period never sends a second invoice.
        pub async fn send_invoice(
            billing: State<Billing>,
            ctx: &ToolContext,
            /// Customer ID, for example "acme".
            #[arg(key = "case_insensitive")]
            customer: String,
            /// Billing period as YYYY-MM, for example "2026-10".
            period: String,
            /// Amount in EUR.
            amount: f64,
            /// What the invoice is for.
            #[arg(ignore)]
            memo: String,
        ) -> Result<Invoice, ToolError> {
            let _ = ctx;
            Ok(billing.send(&customer, &period, amount, &memo).await)
        }
    };
    super::expand(args, item)
}

fn pretty(tokens: TokenStream) -> String {
    let file: syn::File = syn::parse2(tokens).expect("the expansion is a valid file");
    prettyplease::unparse(&file)
}

#[test]
fn send_invoice_expansion() {
    let args = quote!(
        idempotent(
            key = "invoice:<customer>:<period>",
            status = "invoice_status"
        ),
        timeout = "2s"
    );
    let header = "// The expansion of DESIGN.md's `send_invoice`, as `#[tool]` writes it.\n\
                  // Regenerate: UPDATE_EXPECT=1 cargo test -p toolkey-macros\n\n";
    let text = format!("{header}{}", pretty(send_invoice(args)));
    expect_test::expect_file!["../../snapshots/send_invoice.rs"].assert_eq(&text);
}

#[test]
fn limits_expansion() {
    // A read-only lookup of a rate-limited API: three failures of one call within five minutes,
    // and at most four lookups at once.
    let args = quote!(
        read_only,
        timeout = "2s",
        retry_limit = "3/5m",
        concurrency = 4
    );
    let item = quote! {
        /// Find the invoice of one customer and billing period.
        pub async fn find_invoice(
            billing: State<Billing>,
            /// Customer ID.
            customer: String,
            /// Billing period as YYYY-MM.
            period: String,
        ) -> Result<Option<Invoice>, ToolError> {
            Ok(billing.find(&customer, &period).await)
        }
    };
    let header =
        "// The expansion of a read-only tool with a retry limit and a concurrency limit.\n\
                  // Regenerate: UPDATE_EXPECT=1 cargo test -p toolkey-macros\n\n";
    let text = format!("{header}{}", pretty(super::expand(args, item)));
    expect_test::expect_file!["../../snapshots/find_invoice.rs"].assert_eq(&text);
}

#[test]
fn retry_limit_off_says_so() {
    let text = send_invoice(quote!(
        idempotent(key = "invoice:<customer>:<period>"),
        retry_limit = "off"
    ))
    .to_string()
    .replace(' ', "");
    assert!(
        text.contains("__settings.retry_limit=::toolkey::__private::RetryLimit::off();"),
        "{text}"
    );
    assert!(!text.contains("__settings.concurrency"), "{text}");
}

#[test]
fn retry_limits_parse_as_written() {
    use super::attr::{retry_limit, RetryLimit};
    use std::time::Duration;
    assert_eq!(retry_limit("off"), Ok(RetryLimit::Off));
    assert_eq!(
        retry_limit("5/10m"),
        Ok(RetryLimit::After {
            failures: 5,
            window: Duration::from_secs(600)
        })
    );
    for bad in [
        "5", "0/10m", "five/10m", "5/", "5/10", "5/0s", "/10m", "-1/10m",
    ] {
        assert!(retry_limit(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn crate_override_reaches_every_path() {
    let args = quote!(
        idempotent(key = "invoice:<customer>:<period>", recover = find_invoice),
        crate = "::tk"
    );
    let text = send_invoice(args).to_string().replace(' ', "");
    assert!(text.contains("::tk::__private::"), "{text}");
    assert!(
        !text.contains("toolkey"),
        "a path escaped the override: {text}"
    );
}

#[test]
fn key_part_derive_takes_the_override() {
    let item = quote! {
        #[key_part(crate = "::tk")]
        enum Plan { Basic, Pro }
    };
    let text = crate::key_part::expand(item).to_string().replace(' ', "");
    assert!(text.contains("impl::tk::KeyPartforPlan"), "{text}");
    assert!(!text.contains("toolkey"), "{text}");
}

#[test]
fn errors_leave_the_fn_and_its_struct() {
    // On error the fn and the struct stay, so code that uses them does not add more errors.
    let args = quote!(idempotent(key = "invoice:<nobody>"));
    let text = send_invoice(args).to_string();
    assert!(text.contains("compile_error"), "{text}");
    assert!(text.contains("pub async fn send_invoice"), "{text}");
    assert!(text.contains("pub struct SendInvoice"), "{text}");
    assert!(
        !text.contains("impl"),
        "no half-written impl on error: {text}"
    );
}

/// The expansion of a keyed tool whose `amount` and `memo` fields carry `attrs` each.
fn with_field_attrs(key_attr: TokenStream, attrs: TokenStream) -> String {
    let item = quote! {
        pub async fn send_invoice(
            #key_attr
            customer: String,
            #attrs
            amount: f64,
            #attrs
            memo: String,
        ) -> Result<String, ToolError> {
            Ok(customer)
        }
    };
    let args = quote!(idempotent(key = "invoice:<customer>"));
    super::expand(args, item).to_string().replace(' ', "")
}

/// Which status companion and fingerprint schema a tool gets: built from its target where its
/// fields keep their names and types, derived where an attribute may change them.
#[test]
fn a_status_companion_is_built_from_its_target_unless_an_attribute_needs_the_struct() {
    let built = |text: &str| {
        let status = text.contains("StatusArgs::new(") && !text.contains("struct__StatusArgs");
        let fingerprint = !text.contains("struct__Fingerprint");
        (status, fingerprint)
    };
    let cases = [
        (quote!(), quote!(), (true, true)),
        (quote!(), quote!(#[serde(default)]), (true, true)),
        (quote!(), quote!(#[serde(default = "zero")]), (true, true)),
        // On a key field, a default changes how the companion reads it.
        (quote!(#[serde(default)]), quote!(), (false, true)),
        (quote!(), quote!(#[serde(rename = "other")]), (false, false)),
        (
            quote!(),
            quote!(#[serde(default, alias = "sum")]),
            (false, false),
        ),
        (
            quote!(),
            quote!(#[schemars(rename = "other")]),
            (false, false),
        ),
        (
            quote!(#[schemars(length(max = 9))]),
            quote!(),
            (false, false),
        ),
    ];
    for (key_attr, attrs, expected) in cases {
        let text = with_field_attrs(key_attr.clone(), attrs.clone());
        assert_eq!(built(&text), expected, "{key_attr} / {attrs}: {text}");
    }
}
