//! `examples/mcp_server`, started as a child process and driven over stdio by rmcp's own client:
//! keys, replays and CONFLICT hold over MCP as they do in process.
#![cfg(feature = "mcp")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// Builds the example with the features and profile this test was built with — nothing to do
/// when `cargo test` built it already — and returns its executable, as cargo reports it (so the
/// target directory and its layout are cargo's business, not the test's).
fn server_binary() -> PathBuf {
    let features: Vec<&str> = [
        ("mcp", true),
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args([
            "build",
            "-p",
            "toolkey",
            "--example",
            "mcp_server",
            "--message-format=json",
            "--no-default-features",
        ])
        .args(["--features", &features.join(",")]);
    if !cfg!(debug_assertions) {
        cargo.arg("--release");
    }
    let output = cargo.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "building examples/mcp_server failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == "mcp_server"
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the example's executable")
}

type Client = RunningService<RoleClient, ()>;

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let arguments = arguments
        .as_object()
        .expect("arguments are an object")
        .clone();
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("tools/call {tool} failed: {e}"))
}

/// The result's text block, parsed as JSON.
fn text(result: &CallToolResult) -> Value {
    let text = &result
        .content
        .first()
        .and_then(|c| c.as_text())
        .expect("a text block")
        .text;
    serde_json::from_str(text).expect("the text is JSON")
}

fn replayed(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.get("toolkey/replayed"))
        == Some(&json!(true))
}

fn hints(tool: &Tool) -> [Option<bool>; 4] {
    let a = tool.annotations.as_ref().expect("annotations");
    [
        a.read_only_hint,
        a.destructive_hint,
        a.idempotent_hint,
        a.open_world_hint,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoices_over_mcp_run_once_replay_and_conflict() {
    let binary = server_binary();
    let transport =
        TokioChildProcess::new(tokio::process::Command::new(&binary)).expect("the server starts");
    let client: Client = ().serve(transport).await.expect("the server initializes");

    let session = async {
        let tools = client.list_all_tools().await.expect("tools/list");
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort();
        assert_eq!(names, ["invoice_status", "list_invoices", "send_invoice"]);
        let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap();
        // read-only, destructive, idempotent, open world
        assert_eq!(
            hints(tool("send_invoice")),
            [Some(false), Some(true), Some(true), Some(true)]
        );
        assert_eq!(
            hints(tool("invoice_status")),
            [Some(true), Some(false), Some(true), Some(true)]
        );
        assert_eq!(
            hints(tool("list_invoices")),
            [Some(true), Some(false), Some(true), Some(true)]
        );
        let send = tool("send_invoice");
        assert_eq!(
            send.input_schema["required"],
            json!(["customer", "period", "amount", "memo"])
        );
        assert_eq!(
            send.output_schema
                .as_ref()
                .expect("an object result has an output schema")["type"],
            "object"
        );

        let args = json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "October hosting"});
        let first = call(&client, "send_invoice", args.clone()).await;
        assert_eq!(first.is_error, Some(false), "{first:?}");
        let invoice = first
            .structured_content
            .clone()
            .expect("structured content");
        assert_eq!(invoice["id"], "inv-1");
        assert_eq!(
            text(&first),
            invoice,
            "the text block is a copy of the structured result"
        );
        assert!(!replayed(&first));

        // The model rewords the memo (ignored by the key's fingerprint): the same action.
        let reworded = json!({"customer": "acme", "period": "2026-10", "amount": 120.0, "memo": "Hosting, October"});
        let second = call(&client, "send_invoice", reworded).await;
        assert_eq!(second.is_error, Some(false), "{second:?}");
        assert_eq!(second.structured_content.as_ref(), Some(&invoice));
        assert!(replayed(&second), "the second call is a replay: {second:?}");

        let other_amount = json!({"customer": "acme", "period": "2026-10", "amount": 99.0, "memo": "October hosting"});
        let third = call(&client, "send_invoice", other_amount).await;
        assert_eq!(third.is_error, Some(true), "{third:?}");
        let error = text(&third);
        assert_eq!(error["error"]["code"], "CONFLICT");
        assert_eq!(error["error"]["retryable"], false);

        let status = call(
            &client,
            "invoice_status",
            json!({"customer": "ACME ", "period": "2026-10"}),
        )
        .await;
        assert_eq!(
            status.structured_content.as_ref().unwrap()["status"],
            "completed"
        );
        assert_eq!(
            status.structured_content.as_ref().unwrap()["result"]["id"],
            "inv-1"
        );

        let unknown = call(&client, "send_invoices", json!({})).await;
        assert_eq!(unknown.is_error, Some(true));
        assert_eq!(text(&unknown)["error"]["code"], "UNKNOWN_TOOL");

        let ledger = call(&client, "list_invoices", json!({})).await;
        let invoices = &ledger
            .structured_content
            .as_ref()
            .expect("structured content")["invoices"];
        assert_eq!(
            invoices.as_array().map(Vec::len),
            Some(1),
            "exactly one invoice was sent: {invoices}"
        );
    };
    tokio::time::timeout(Duration::from_secs(60), session)
        .await
        .expect("the MCP session finishes in time");
    client.cancel().await.expect("the client closes");
}
