//! A catalog of tools whose arguments cover the types users write — strings, integers, floats,
//! bools, `Option`, `Vec`, nested structs, unit and data-carrying enums, doc comments on nested
//! fields, no parameters at all — and one tool of every story. The export tests run over it.

use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolkey::{tool, State, ToolError, Toolbox};

use crate::billing::{Billing, SendInvoice};

/// A postal address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Address {
    /// Street and house number.
    pub street: String,
    /// A second address line, if there is one.
    pub line2: Option<String>,
    /// City.
    pub city: String,
    /// ISO 3166-1 alpha-2 country code, for example "DE".
    pub country: String,
}

/// One line of a shipment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LineItem {
    /// The product's stock keeping unit.
    pub sku: String,
    /// How many pieces.
    pub quantity: u32,
    /// Wrap this item as a gift.
    pub gift_wrap: bool,
}

/// How fast the parcel travels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Speed {
    /// Three to five working days.
    Standard,
    /// The next working day.
    Express,
}

/// Where the parcel goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// To the address's door.
    Door,
    /// To a pickup point near the address.
    PickupPoint {
        /// The pickup point's ID, from the carrier's list.
        id: String,
    },
    /// Held at the depot for this many days.
    Hold(u8),
}

/// Whom to tell when the parcel ships.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "channel", rename_all = "snake_case")]
pub enum Notify {
    /// An email.
    Email {
        /// The address to write to.
        address: String,
    },
    /// A text message.
    Sms {
        /// The phone number in E.164 form, for example "+4930123456".
        phone: String,
    },
}

/// A shipment as the carrier booked it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking: String,
    /// The order shipped.
    pub order_id: String,
    /// How many pieces are in the parcel.
    pub pieces: u32,
}

/// An order, as search lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderSummary {
    /// The order's ID.
    pub id: i64,
    /// Total in EUR.
    pub total: f64,
}

/// How urgent an order is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    Normal,
    High,
}

/// A fake carrier: counts every shipment it books.
#[derive(Default)]
pub struct Carrier {
    pub shipments: Mutex<Vec<Shipment>>,
}

/// Book the shipment of one order with the carrier.
///
/// Safe to retry: one order is shipped once.
#[tool(idempotent(key = "shipment:<order_id>", destructive = false))]
#[allow(clippy::too_many_arguments)] // a tool takes what the action needs
pub async fn create_shipment(
    carrier: State<Carrier>,
    /// The order to ship, for example "ord-1042".
    order_id: String,
    /// Where the parcel goes.
    address: Address,
    /// What goes in the parcel.
    items: Vec<LineItem>,
    /// How fast it travels.
    speed: Speed,
    /// How it is handed over.
    delivery: Delivery,
    /// Whom to tell when it ships, if anyone.
    notify: Option<Notify>,
    /// Insure the parcel for this many EUR; uninsured when absent.
    insured_value: Option<f64>,
) -> Result<Shipment, ToolError> {
    let _ = (address, speed, delivery, notify, insured_value);
    let mut shipments = carrier.shipments.lock().unwrap();
    let shipment = Shipment {
        tracking: format!("trk-{}", shipments.len() + 1),
        order_id,
        pieces: items.iter().map(|item| item.quantity).sum(),
    };
    shipments.push(shipment.clone());
    Ok(shipment)
}

/// Find orders by customer and total.
#[tool(read_only)]
pub async fn search_orders(
    /// Free text to match, for example a customer name.
    query: String,
    /// Only orders of this customer, when given.
    customer: Option<String>,
    /// Only orders with at least this total in EUR.
    min_total: Option<f64>,
    /// How many orders to return at most.
    #[serde(default = "default_limit")]
    limit: u32,
    /// Include archived orders.
    include_archived: bool,
) -> Result<Vec<OrderSummary>, ToolError> {
    let _ = (query, customer, include_archived);
    let total = min_total.unwrap_or(10.0);
    Ok((0..limit.min(3))
        .map(|i| OrderSummary {
            id: 1000 + i64::from(i),
            total,
        })
        .collect())
}

fn default_limit() -> u32 {
    20
}

/// Set an order's priority. Setting the same priority again changes nothing.
#[tool(natural)]
pub async fn set_priority(
    /// The order's numeric ID.
    order_id: i64,
    /// The new priority.
    priority: Priority,
) -> Result<(), ToolError> {
    let _ = (order_id, priority);
    Ok(())
}

/// Cancel an order. Needs a person's approval.
#[tool(unkeyed)]
pub async fn cancel_order(
    /// The order's numeric ID.
    order_id: i64,
    /// Why, in the customer's words.
    reason: Option<String>,
) -> Result<bool, ToolError> {
    let _ = (order_id, reason);
    Ok(true)
}

/// Check that the service answers.
#[tool(read_only)]
pub async fn ping() -> Result<String, ToolError> {
    Ok("pong".into())
}

/// Where a refund goes back to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum RefundTo {
    /// Back to the card the order was paid with.
    Card {
        /// The card's last four digits, as the receipt shows them.
        last4: String,
    },
    /// To a bank account.
    Bank {
        /// The account's IBAN.
        iban: String,
    },
}

/// A fake payment provider: counts every refund it pays out.
#[derive(Default)]
pub struct Payments {
    pub refunds: Mutex<Vec<String>>,
}

/// Refund part of an order, to the card it was paid with or to a bank account.
///
/// Safe to retry: one order is refunded once.
#[tool(idempotent(key = "refund:<order_id>", status = "refund_status"))]
pub async fn refund(
    payments: State<Payments>,
    /// The order to refund, for example "ord-1042".
    order_id: String,
    /// How much, in euro cents.
    cents: u64,
    /// Where the money goes: `method` says which, and the fields beside it say where.
    #[serde(flatten)]
    to: RefundTo,
) -> Result<String, ToolError> {
    let mut refunds = payments.refunds.lock().unwrap();
    let to = match to {
        RefundTo::Card { last4 } => format!("card {last4}"),
        RefundTo::Bank { iban } => format!("bank {iban}"),
    };
    refunds.push(format!("{order_id}:{cents}:{to}"));
    Ok(format!("rf-{}", refunds.len()))
}

/// Label an order with tags, each a name and a value: `"gift": "yes"`.
///
/// Safe to retry: an order is labelled once.
#[tool(idempotent(key = "labels:<order_id>", status = "labels_status"))]
pub async fn label_order(
    payments: State<Payments>,
    /// The order to label.
    order_id: String,
    /// The labels, each a field of its own beside `order_id`.
    #[serde(flatten)]
    labels: std::collections::BTreeMap<String, String>,
) -> Result<usize, ToolError> {
    let _ = (payments, order_id);
    Ok(labels.len())
}

/// A card, as the receipt shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CardRef {
    /// The card's last four digits.
    pub last4: String,
}

/// Where a payout goes: a newtype variant, whose fields are its type's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum PayTo {
    /// To a card.
    Card(CardRef),
    /// To a bank account.
    Bank {
        /// The account's IBAN.
        iban: String,
    },
}

/// How fast a payout goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "speed", rename_all = "snake_case")]
pub enum PayoutSpeed {
    /// Within minutes, for a fee.
    Instant {
        /// The fee, in euro cents.
        fee_cents: u64,
    },
    /// Within three days.
    Standard,
}

/// Pay money out to a card or a bank account, instantly or not.
///
/// Safe to retry: one payout is paid once.
#[tool(idempotent(key = "payout:<payout_id>", status = "payout_status"))]
pub async fn pay_out(
    payments: State<Payments>,
    /// The payout's own id, for example "po-7".
    payout_id: String,
    /// How much, in euro cents.
    cents: u64,
    /// Where the money goes.
    #[serde(flatten)]
    to: PayTo,
    /// How fast.
    #[serde(flatten)]
    speed: PayoutSpeed,
) -> Result<String, ToolError> {
    let mut refunds = payments.refunds.lock().unwrap();
    let to = match to {
        PayTo::Card(card) => format!("card {}", card.last4),
        PayTo::Bank { iban } => format!("bank {iban}"),
    };
    let speed = match speed {
        PayoutSpeed::Instant { fee_cents } => format!("instant, fee {fee_cents}"),
        PayoutSpeed::Standard => "standard".to_string(),
    };
    refunds.push(format!("{payout_id}:{cents}:{to}:{speed}"));
    Ok(format!("po-{}", refunds.len()))
}

/// A toolbox with every catalog tool, and the fake outside systems it calls.
pub struct Fixture {
    pub toolbox: Toolbox,
    pub billing: Arc<Billing>,
    pub carrier: Arc<Carrier>,
    pub payments: Arc<Payments>,
}

/// Every catalog tool, a fake billing system and carrier, and an approver that approves
/// everything.
pub fn fixture() -> Fixture {
    let billing = Arc::new(Billing::default());
    let carrier = Arc::new(Carrier::default());
    let payments = Arc::new(Payments::default());
    let toolbox = Toolbox::builder()
        .shared_state(billing.clone())
        .shared_state(carrier.clone())
        .shared_state(payments.clone())
        .tool(SendInvoice)
        .tool(CreateShipment)
        .tool(SearchOrders)
        .tool(SetPriority)
        .tool(CancelOrder)
        .tool(Ping)
        .tool(Refund)
        .tool(LabelOrder)
        .tool(PayOut)
        .approver(|_: &toolkey::ApprovalRequest<'_>| true)
        .build()
        .expect("the catalog toolbox builds");
    Fixture {
        toolbox,
        billing,
        carrier,
        payments,
    }
}

/// The catalog's toolbox.
pub fn toolbox() -> Toolbox {
    fixture().toolbox
}

/// Arguments for each catalog tool that its canonical schema accepts, every field given.
pub fn arguments(tool: &str) -> Value {
    match tool {
        "send_invoice" => {
            json!({"customer": "acme", "period": "2026-10", "amount": 120.5, "memo": "October hosting"})
        }
        // A status companion takes its tool's arguments as they are.
        "invoice_status" => arguments("send_invoice"),
        "create_shipment" => json!({
            "order_id": "ord-1042",
            "address": {"street": "Hauptstr. 1", "line2": "Hinterhaus", "city": "Berlin", "country": "DE"},
            "items": [{"sku": "mug-1", "quantity": 2, "gift_wrap": false}, {"sku": "tea-3", "quantity": 1, "gift_wrap": true}],
            "speed": "express",
            "delivery": {"pickup_point": {"id": "pp-7"}},
            "notify": {"channel": "sms", "phone": "+4930123456"},
            "insured_value": 250.0
        }),
        "create_shipment_status" => arguments("create_shipment"),
        "search_orders" => {
            json!({"query": "acme", "customer": "acme", "min_total": 50.0, "limit": 1, "include_archived": true})
        }
        "set_priority" => json!({"order_id": -7, "priority": "high"}),
        "cancel_order" => json!({"order_id": 1042, "reason": "ordered twice"}),
        "ping" => json!({}),
        "refund" => {
            json!({"order_id": "ord-1042", "cents": 1250, "method": "card", "last4": "4242"})
        }
        "refund_status" => arguments("refund"),
        "label_order" => json!({"order_id": "ord-1042", "gift": "yes", "wrap": "blue"}),
        "labels_status" => arguments("label_order"),
        "pay_out" => json!({
            "payout_id": "po-7", "cents": 900, "method": "card", "last4": "4242",
            "speed": "instant", "fee_cents": 50
        }),
        "payout_status" => arguments("pay_out"),
        other => panic!("no sample arguments for `{other}`"),
    }
}

/// The arguments as OpenAI's strict mode has a model send them: every field present, the
/// optional ones left out as `null` (nested ones too).
pub fn strict_arguments(tool: &str) -> Value {
    match tool {
        "create_shipment" => json!({
            "order_id": "ord-1042",
            "address": {"street": "Hauptstr. 1", "line2": null, "city": "Berlin", "country": "DE"},
            "items": [{"sku": "mug-1", "quantity": 2, "gift_wrap": false}],
            "speed": "standard",
            "delivery": "door",
            "notify": null,
            "insured_value": null
        }),
        "search_orders" => {
            json!({"query": "acme", "customer": null, "min_total": null, "limit": null, "include_archived": false})
        }
        "cancel_order" => json!({"order_id": 1042, "reason": null}),
        // A status companion needs only the key fields; the rest may be null.
        "invoice_status" => {
            json!({"customer": "acme", "period": "2026-10", "amount": null, "memo": null})
        }
        "create_shipment_status" => json!({
            "order_id": "ord-1042", "address": null, "items": null, "speed": null,
            "delivery": null, "notify": null, "insured_value": null
        }),
        "refund" => json!({
            "order_id": "ord-1042", "cents": 1250, "method": "card", "last4": "4242", "iban": null
        }),
        "refund_status" => json!({
            "order_id": "ord-1042", "cents": null, "method": null, "last4": null, "iban": null
        }),
        "pay_out" => json!({
            "payout_id": "po-7", "cents": 900, "method": "card", "last4": "4242", "iban": null,
            "speed": "instant", "fee_cents": 50
        }),
        "payout_status" => json!({
            "payout_id": "po-7", "cents": null, "method": null, "last4": null, "iban": null,
            "speed": null, "fee_cents": null
        }),
        other => arguments(other),
    }
}
