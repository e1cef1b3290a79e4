//! Keys and fingerprints as `#[tool]` derives them: normalization, escaping, the length rule,
//! `hash = true`, what the fingerprint covers, and the key a body reads from its context.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Value};
use toolkey::{
    tool, Fingerprint, IdempotencyKey, State, Tool, ToolContext, ToolError, Toolbox, MAX_KEY_BYTES,
};
use toolkey_tests::billing;

use billing::{Billing, SendInvoice};

fn ctx() -> ToolContext {
    ToolContext::new("run-7")
        .with_step(4)
        .with_tenant("acme-corp")
}

fn prepared(tool: &impl Tool, args: Value) -> (IdempotencyKey, Fingerprint) {
    let call = tool.prepare(&args, &ctx()).expect("valid arguments");
    (
        call.key().expect("a keyed call").clone(),
        *call.fingerprint().expect("a keyed call"),
    )
}

fn invoice_key(customer: &str, period: &str) -> IdempotencyKey {
    let args = json!({"customer": customer, "period": period, "amount": 100.0, "memo": "October"});
    prepared(&SendInvoice, args).0
}

#[test]
fn key_is_trimmed_and_lowercased_where_the_field_is_case_insensitive() {
    assert_eq!(
        invoice_key("  ACME ", "2026-10"),
        invoice_key("acme", "2026-10")
    );
    assert_eq!(
        invoice_key("acme", "2026-10").as_str(),
        "invoice:acme:2026-10"
    );
    // One customer whether its "é" is precomposed or decomposed.
    assert_eq!(
        invoice_key("caf\u{e9}", "2026-10"),
        invoice_key("CAFE\u{301}", "2026-10")
    );
}

/// The same customer written in capitals is the same invoice, for letters whose capitals are
/// spelled otherwise too: case is folded in full, not lowercased (`ß` is `SS` in capitals).
#[tokio::test]
async fn a_case_insensitive_key_is_folded_in_full_and_the_invoice_sent_once() {
    let billing = std::sync::Arc::new(Billing::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .tool(SendInvoice)
        .build()
        .unwrap();
    let invoice = |customer: &str| json!({"customer": customer, "period": "2026-10", "amount": 100.0, "memo": "October"});
    let first = toolbox
        .call("send_invoice", invoice("Hauptstraße GmbH"), &ctx())
        .await
        .unwrap();
    assert!(!first.replayed);
    for spelled in ["HAUPTSTRASSE GMBH", "hauptstrasse gmbh", "Hauptstraße GmbH"] {
        let again = toolbox
            .call("send_invoice", invoice(spelled), &ctx())
            .await
            .unwrap();
        assert!(again.replayed, "{spelled}");
        assert_eq!(again.value, first.value);
    }
    assert_eq!(billing.count(), 1);
}

#[test]
fn a_value_cannot_forge_another_part() {
    let forged = invoice_key("acme:2026", "10");
    let real = invoice_key("acme", "2026:10");
    assert_ne!(forged, real);
    assert_eq!(forged.as_str(), "invoice:acme\\:2026:10");
    assert_eq!(real.as_str(), "invoice:acme:2026\\:10");
}

#[test]
fn a_long_key_fits_and_keeps_its_namespace() {
    let customer = "x".repeat(600);
    let key = invoice_key(&customer, "2026-10");
    assert!(
        key.as_str().len() <= MAX_KEY_BYTES,
        "{} bytes",
        key.as_str().len()
    );
    assert_eq!(key.prefix(), "invoice:");
    assert!(key.as_str().starts_with("invoice:"));
    assert!(!key.as_str().contains("xxxx"));
    // The hash covers every byte: one more `x` is another action.
    assert_ne!(key, invoice_key(&"x".repeat(601), "2026-10"));
    // A key that fits is kept as written.
    assert_eq!(
        invoice_key(&"x".repeat(200), "2026-10").as_str().len(),
        "invoice:".len() + 200 + ":2026-10".len()
    );
}

/// Records a patient's visit; names and birth dates are personal data.
#[tool(idempotent(key = "visit:<patient>:<born>", hash = true))]
async fn record_visit(
    /// The patient's full name.
    #[arg(key = "case_insensitive")]
    patient: String,
    /// Date of birth, YYYY-MM-DD.
    born: String,
) -> Result<(), ToolError> {
    let _ = (patient, born);
    Ok(())
}

#[test]
fn hashed_keys_contain_no_argument_text() {
    let key = |patient: &str, born: &str| {
        prepared(&RecordVisit, json!({"patient": patient, "born": born})).0
    };
    let ada = key("Ada Lovelace", "1815-12-10");
    let text = ada.as_str();
    assert!(text.starts_with("visit:"), "{text}");
    for leak in ["ada", "Ada", "lovelace", "1815", "12-10"] {
        assert!(!text.contains(leak), "{leak} in {text}");
    }
    assert!(text.len() <= MAX_KEY_BYTES);
    // Hashing comes after normalization: the same patient written otherwise is the same key.
    assert_eq!(ada, key("  ADA LOVELACE ", "1815-12-10"));
    assert_ne!(ada, key("Ada Lovelace", "1815-12-11"));
}

fn invoice_fingerprint(args: Value) -> Fingerprint {
    prepared(&SendInvoice, args).1
}

#[test]
fn fingerprint_ignores_ignored_fields() {
    let a = invoice_fingerprint(
        json!({"customer": "acme", "period": "2026-10", "amount": 100.0, "memo": "October"}),
    );
    let b = invoice_fingerprint(
        json!({"customer": "acme", "period": "2026-10", "amount": 100.0, "memo": "services in Oct."}),
    );
    assert_eq!(a, b);
    // The amount defines the action: another amount under the same key is a CONFLICT.
    let c = invoice_fingerprint(
        json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "October"}),
    );
    assert_ne!(a, c);
    // Numbers by value.
    let d = invoice_fingerprint(
        json!({"customer": "acme", "period": "2026-10", "amount": 100, "memo": "October"}),
    );
    assert_eq!(a, d);
}

/// Ships an order's lines.
#[tool(idempotent(key = "ship:<order>"))]
async fn ship(
    /// Order ID.
    order: String,
    /// Quantity per product.
    lines: HashMap<String, u32>,
    /// Free-form delivery notes.
    notes: Value,
) -> Result<(), ToolError> {
    let _ = (order, lines, notes);
    Ok(())
}

#[test]
fn fingerprint_ignores_object_key_order() {
    let fingerprint = |text: &str| prepared(&Ship, serde_json::from_str(text).unwrap()).1;
    let a = fingerprint(
        r#"{"order": "o-1", "lines": {"apple": 2, "pear": 1, "fig": 7}, "notes": {"gate": "B", "floor": 3}}"#,
    );
    let b = fingerprint(
        r#"{"notes": {"floor": 3, "gate": "B"}, "lines": {"fig": 7, "apple": 2, "pear": 1}, "order": "o-1"}"#,
    );
    assert_eq!(a, b);
    let c = fingerprint(
        r#"{"order": "o-1", "lines": {"apple": 3, "pear": 1, "fig": 7}, "notes": {"gate": "B", "floor": 3}}"#,
    );
    assert_ne!(a, c);
}

/// A fake payment provider that, like Stripe, takes an idempotency key with each charge.
#[derive(Default)]
struct Provider {
    /// Every request that reached the provider, with the key it carried.
    requests: Mutex<Vec<Option<String>>>,
    /// Charges made: one per distinct key.
    charges: Mutex<HashMap<String, u64>>,
}

/// Charges a customer for a period, forwarding the call's key to the provider.
#[tool(idempotent(key = "charge:<customer>:<period>"))]
async fn charge(
    provider: State<Provider>,
    ctx: &ToolContext,
    /// Customer ID.
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period, YYYY-MM.
    period: String,
    /// Amount in cents.
    cents: u64,
) -> Result<String, ToolError> {
    let _ = (customer, period);
    let key = ctx.idempotency_key().map(|k| k.as_str().to_string());
    provider.requests.lock().unwrap().push(key.clone());
    let key = key.ok_or_else(|| ToolError::new("NO_KEY", "a keyed call has a key"))?;
    provider
        .charges
        .lock()
        .unwrap()
        .entry(key.clone())
        .or_insert(cents);
    Ok(key)
}

/// Reads what the provider holds; no key here.
#[tool(read_only)]
async fn provider_key(ctx: &ToolContext) -> Result<Option<String>, ToolError> {
    Ok(ctx.idempotency_key().map(|k| k.to_string()))
}

#[tokio::test]
async fn the_body_reads_its_key_from_the_context() {
    let provider = std::sync::Arc::new(Provider::default());
    let toolbox = Toolbox::builder()
        .shared_state(provider.clone())
        .tool(Charge)
        .tool(ProviderKey)
        .build()
        .unwrap();
    let first = toolbox
        .call(
            "charge",
            json!({"customer": "ACME", "period": "2026-10", "cents": 1000}),
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(first.value, json!("charge:acme:2026-10"));
    assert!(!first.replayed);
    let (prepared_key, _) = prepared(
        &Charge,
        json!({"customer": " acme", "period": "2026-10", "cents": 1000}),
    );
    assert_eq!(prepared_key.as_str(), "charge:acme:2026-10");

    // A retry, the customer written otherwise, is replayed: the body does not run again, so the
    // provider sees no second request.
    let again = toolbox
        .call(
            "charge",
            json!({"customer": " acme ", "period": "2026-10", "cents": 1000}),
            &ctx(),
        )
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);

    let other = toolbox
        .call(
            "charge",
            json!({"customer": "globex", "period": "2026-10", "cents": 500}),
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(other.value, json!("charge:globex:2026-10"));

    let unkeyed = toolbox
        .call("provider_key", json!({}), &ctx())
        .await
        .unwrap();
    assert_eq!(unkeyed.value, Value::Null);

    let requests = provider.requests.lock().unwrap().clone();
    assert_eq!(
        requests,
        [
            Some("charge:acme:2026-10".to_string()),
            Some("charge:globex:2026-10".to_string())
        ]
    );
    assert_eq!(provider.charges.lock().unwrap().len(), 2);
    assert_eq!(toolbox.stats().executed, 3);
    assert_eq!(toolbox.stats().replayed, 1);
}

#[tokio::test]
async fn the_status_companion_derives_the_same_key() {
    let toolbox = Toolbox::builder()
        .state(Billing::default())
        .tool(SendInvoice)
        .build()
        .unwrap();
    let args = json!({"customer": "acme", "period": "2026:10", "amount": 100.0, "memo": "October"});
    toolbox.call("send_invoice", args, &ctx()).await.unwrap();

    let status = |customer: &str, period: &str| {
        let toolbox = toolbox.clone();
        let args = json!({"customer": customer, "period": period});
        async move {
            toolbox
                .call("invoice_status", args, &ctx())
                .await
                .unwrap()
                .value["status"]
                .clone()
        }
    };
    assert_eq!(status("  ACME ", "2026:10").await, "completed");
    assert_eq!(status("acme:2026", "10").await, "not_found");
    assert_eq!(status("acme", "2026-10").await, "not_found");
}

/// Book a seat on a flight.
#[tool(idempotent(key = "seat:<flight>"))]
async fn book_seat(
    flight: String,
    seat: String,
    price: f64,
    bags: u8,
    meal: Option<String>,
    window: bool,
) -> Result<String, ToolError> {
    let _ = (price, bags, meal, window);
    Ok(format!("{flight}/{seat}"))
}

/// The bytes a fingerprint hashes, pinned: the tool's name as a JSON string, a newline, then the
/// defining arguments (the key's fields left out) as canonical JSON: keys sorted, no white
/// space, `120.0` as `120`, strings escaped as serde_json escapes them. Fingerprints already
/// stored were made this way, and a call made now must match them.
#[test]
fn a_fingerprint_hashes_the_canonical_text_of_its_arguments() {
    use sha2::{Digest, Sha256};
    let expect = |text: &str| {
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let cases = [
        (
            json!({"flight": "LH 400", "seat": "12A", "price": 120.0, "bags": 2, "meal": null, "window": true}),
            "\"book_seat\"\n{\"bags\":2,\"meal\":null,\"price\":120,\"seat\":\"12A\",\"window\":true}",
        ),
        (
            json!({"window": false, "meal": "vegan \"plus\"\n", "bags": 0, "price": 120.5, "seat": "1C", "flight": "LH 400"}),
            "\"book_seat\"\n{\"bags\":0,\"meal\":\"vegan \\\"plus\\\"\\n\",\"price\":120.5,\"seat\":\"1C\",\"window\":false}",
        ),
        (
            json!({"flight": "x", "seat": "é🧾", "price": -0.0, "bags": 255, "window": true}),
            "\"book_seat\"\n{\"bags\":255,\"meal\":null,\"price\":0,\"seat\":\"é🧾\",\"window\":true}",
        ),
    ];
    for (args, text) in cases {
        let (_, fingerprint) = prepared(&BookSeat, args.clone());
        assert_eq!(fingerprint.to_hex(), expect(text), "{args}");
    }
}
