//! The toolbox under fuzzing: one tool of each kind a model meets, with every kind of parameter.
//!
//! | tool | story | what it covers |
//! |---|---|---|
//! | `send_invoice` | keyed, status `invoice_status` | string key parts (one case-insensitive), a float, `#[arg(ignore)]`, an optional field, a terminal error |
//! | `book_seat` | keyed, status `book_seat_status` | integer, bool, unit enum and uuid key parts; a nested struct with a list, without `deny_unknown_fields` |
//! | `ship_order` | keyed, status `ship_order_status` | a case-sensitive key part, a `u16` part, a map, a set, nested optional structs without `deny_unknown_fields`, an untagged enum |
//! | `record_visit` | keyed with `hash = true`, status `record_visit_status` | personal data hashed out of the key |
//! | `refund` | keyed on `ctx.run_id` and `ctx.step`, no status | a key the model cannot influence |
//! | `find_customer` | `read_only` | an optional integer |
//! | `set_plan` | `natural` | an enum argument |
//! | `pay_back` | keyed, status `pay_back_status` | a flattened internally tagged enum |
//! | `tag_order` | keyed, status `tag_order_status` | a flattened map: any other name is a tag |
//! | `pay_out` | keyed, status `pay_out_status` | two flattened enums, one with a newtype variant |
//!
//! Every body writes one line to the [`Ledger`], the fake outside system: the effects a target
//! counts.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolkey::{tool, KeyPart, State, ToolContext, ToolError, Toolbox};

/// The fake outside system: one line per effect, in order.
#[derive(Default)]
pub struct Ledger {
    effects: Mutex<Vec<String>>,
}

impl Ledger {
    /// How many effects happened.
    pub fn count(&self) -> usize {
        self.effects.lock().unwrap().len()
    }

    /// Forgets every effect.
    pub fn reset(&self) {
        self.effects.lock().unwrap().clear();
    }

    fn record(&self, tool: &str) -> usize {
        let mut effects = self.effects.lock().unwrap();
        effects.push(tool.to_string());
        effects.len()
    }
}

/// Sends the invoice for one customer and billing period.
#[tool(idempotent(key = "invoice:<customer>:<period>", status = "invoice_status"))]
async fn send_invoice(
    ledger: State<Ledger>,
    /// Customer ID, for example "acme"; case means nothing in it.
    #[arg(key = "case_insensitive")]
    customer: String,
    /// Billing period as YYYY-MM.
    period: String,
    /// Amount in EUR.
    amount: f64,
    /// The customer's purchase order number, when they gave one.
    po_number: Option<String>,
    /// What the invoice is for, as the model words it.
    #[arg(ignore)]
    memo: String,
) -> Result<Value, ToolError> {
    if amount < 0.0 {
        return Err(
            ToolError::new("NEGATIVE_AMOUNT", "an invoice cannot be negative")
                .with_suggestion("issue a credit note instead"),
        );
    }
    let n = ledger.record("send_invoice");
    Ok(
        json!({"id": format!("inv-{n}"), "customer": customer, "period": period,
              "amount": amount, "po_number": po_number, "memo": memo}),
    )
}

/// A fare class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, KeyPart)]
#[serde(rename_all = "snake_case")]
pub enum Plan {
    /// The cheapest fare.
    Basic,
    /// Everything included.
    ProPlus,
}

/// A meal ordered with a seat: a struct without `deny_unknown_fields`, as most are (the
/// runtime refuses a field its schema does not name).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Meal {
    /// The kind of meal.
    kind: MealKind,
    /// Allergies to respect.
    allergies: Vec<String>,
}

/// Kinds of meal.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MealKind {
    /// Vegetarian.
    Vegetarian,
    /// Anything.
    Regular,
}

/// Books one seat on a flight for a passenger.
#[tool(idempotent(key = "seat:<flight>:<row>:<window>:<plan>:<passenger>"))]
#[allow(clippy::too_many_arguments)]
async fn book_seat(
    ledger: State<Ledger>,
    /// Flight number.
    flight: u32,
    /// Seat row; negative rows are the crew's.
    row: i64,
    /// A window seat.
    window: bool,
    /// Fare class.
    plan: Plan,
    /// The passenger's ID.
    passenger: uuid::Uuid,
    /// The seat letter.
    letter: char,
    /// A meal to serve, if any.
    meal: Option<Meal>,
) -> Result<Value, ToolError> {
    let n = ledger.record("book_seat");
    Ok(
        json!({"booking": n, "flight": flight, "row": row, "window": window, "plan": plan,
              "passenger": passenger, "letter": letter, "meal": meal}),
    )
}

/// A delivery address (without `deny_unknown_fields`, as [`Meal`]).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Address {
    /// Street and number.
    street: String,
    /// City.
    city: String,
    /// Postal code, when the country has them.
    zip: Option<String>,
}

/// Ships an order's lines from one warehouse.
#[tool(idempotent(key = "ship:<order>/<warehouse>"))]
#[allow(clippy::too_many_arguments)]
async fn ship_order(
    ledger: State<Ledger>,
    /// Order ID, case-sensitive.
    order: String,
    /// Warehouse number.
    warehouse: u16,
    /// Quantity per product.
    lines: BTreeMap<String, u32>,
    /// Labels to print on the parcel.
    labels: BTreeSet<String>,
    /// Handling flags, in any order.
    flags: HashSet<String>,
    /// Where to deliver.
    address: Address,
    /// A second address to send the invoice to.
    billing_address: Option<Address>,
    /// Who hears of the shipment.
    contact: Option<Contact>,
) -> Result<Value, ToolError> {
    let n = ledger.record("ship_order");
    Ok(
        json!({"shipment": n, "order": order, "warehouse": warehouse, "lines": lines,
               "labels": labels, "flags": flags.len(), "address": address,
               "billing_address": billing_address, "contact": contact}),
    )
}

/// Who hears of a shipment: an untagged enum, which serde reads as its first branch that
/// parses, ignoring the others' fields.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Contact {
    /// By email.
    Email {
        /// The address.
        email: String,
    },
    /// By phone.
    Phone {
        /// The number.
        phone: String,
        /// The country code, if not the shipment's.
        cc: Option<String>,
    },
}

/// Records a patient's visit; names and birth dates are personal data.
#[tool(idempotent(key = "visit:<patient>:<born>", hash = true))]
async fn record_visit(
    ledger: State<Ledger>,
    /// The patient's full name.
    patient: String,
    /// Date of birth, YYYY-MM-DD.
    born: String,
    /// Notes from the visit.
    #[arg(ignore)]
    notes: Option<String>,
) -> Result<Value, ToolError> {
    let n = ledger.record("record_visit");
    let _ = (patient, born, notes);
    Ok(json!({"visit": n}))
}

/// Refunds the current run's order.
#[tool(idempotent(key = "refund:<ctx.run_id>:<ctx.step>", status = false))]
async fn refund(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    /// Amount in cents.
    cents: u64,
    /// Why, as the model words it.
    #[arg(ignore)]
    reason: String,
) -> Result<Value, ToolError> {
    let n = ledger.record("refund");
    let _ = reason;
    Ok(json!({"refund": n, "cents": cents, "run": ctx.run_id()}))
}

/// Finds customers by name.
#[tool(read_only)]
async fn find_customer(
    ledger: State<Ledger>,
    /// Part of the customer's name.
    name: String,
    /// At most this many results.
    limit: Option<u8>,
) -> Result<Vec<String>, ToolError> {
    let _ = ledger;
    let limit = usize::from(limit.unwrap_or(3));
    Ok(std::iter::repeat_n(name, limit.min(3)).collect())
}

/// Sets a customer's plan.
#[tool(natural)]
async fn set_plan(
    ledger: State<Ledger>,
    /// Customer ID.
    customer: String,
    /// The plan to set.
    plan: Plan,
) -> Result<bool, ToolError> {
    ledger.record("set_plan");
    let _ = (customer, plan);
    Ok(true)
}

/// Where money goes back to: the branch `method` names, with its own fields.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum PayTo {
    /// Back to a card.
    Card {
        /// The card's last four digits.
        last4: String,
    },
    /// To a bank account.
    Bank {
        /// The account's IBAN.
        iban: String,
        /// Who holds the account.
        holder: Option<String>,
    },
}

/// Pays an order's money back, to a card or a bank account.
#[tool(idempotent(key = "payback:<order>", status = "pay_back_status"))]
async fn pay_back(
    ledger: State<Ledger>,
    /// The order paid back.
    order: String,
    /// Cents paid back.
    cents: u32,
    #[serde(flatten)] to: PayTo,
) -> Result<Value, ToolError> {
    let n = ledger.record("pay_back");
    Ok(json!({"payback": n, "order": order, "cents": cents, "to": to}))
}

/// Tags an order: every field beside `order` is a tag and its value.
#[tool(idempotent(key = "tags:<order>", status = "tag_order_status"))]
async fn tag_order(
    ledger: State<Ledger>,
    /// The order tagged.
    order: String,
    #[serde(flatten)] tags: BTreeMap<String, String>,
) -> Result<usize, ToolError> {
    ledger.record("tag_order");
    let _ = order;
    Ok(tags.len())
}

/// A card, by the digits on the receipt.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CardRef {
    /// The card's last four digits.
    last4: String,
}

/// Where a payout goes: a newtype variant's fields are its type's.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum PayoutTo {
    /// To a card.
    Card(CardRef),
    /// To a bank account.
    Bank {
        /// The account's IBAN.
        iban: String,
    },
}

/// How fast a payout goes.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "speed", rename_all = "snake_case")]
pub enum Speed {
    /// Within minutes, for a fee.
    Instant {
        /// The fee in cents.
        fee: u16,
    },
    /// Within days.
    Standard,
}

/// Pays money out: two flattened enums side by side.
#[tool(idempotent(key = "payout:<order>", status = "pay_out_status"))]
async fn pay_out(
    ledger: State<Ledger>,
    /// The order paid out.
    order: String,
    #[serde(flatten)] to: PayoutTo,
    #[serde(flatten)] speed: Speed,
) -> Result<Value, ToolError> {
    let n = ledger.record("pay_out");
    Ok(json!({"payout": n, "order": order, "to": to, "speed": speed}))
}

/// The toolbox every target calls: all the tools above, over `store`, with `ledger` as their
/// outside system.
pub fn toolbox(
    store: std::sync::Arc<dyn toolkey::store::Store>,
    ledger: std::sync::Arc<Ledger>,
) -> Toolbox {
    Toolbox::builder()
        .shared_store(store)
        .shared_state(ledger)
        .tool(SendInvoice)
        .tool(BookSeat)
        .tool(ShipOrder)
        .tool(RecordVisit)
        .tool(Refund)
        .tool(FindCustomer)
        .tool(SetPlan)
        .tool(PayBack)
        .tool(TagOrder)
        .tool(PayOut)
        .build()
        .expect("the fuzz toolbox is well formed")
}
