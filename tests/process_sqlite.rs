//! Real OS processes sharing one SQLite file: concurrent callers, and a worker killed (SIGKILL,
//! no unwinding) while it holds a key.
//!
//! The test binary runs itself as the child process: `child_process_entry` does the child's
//! part when `TOOLKEY_CHILD` is set, and nothing otherwise.
#![cfg(all(feature = "sqlite", unix))]

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::json;
use toolkey::store::SqliteStore;
use toolkey::{tool, ErrorCode, State, ToolContext, ToolError, Toolbox};
use toolkey_tests::child;

/// The outside system: a ledger of refunds in its own SQLite file, and this process's role.
struct Outside {
    ledger: Mutex<Connection>,
    role: Role,
    executions: AtomicUsize,
    marker: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    /// Do the work and return.
    Normal,
    /// Signal, then hang before the effect: killed before it acted.
    HangBeforeEffect,
    /// Make the effect, signal, then hang: killed after it acted, before recording.
    HangAfterEffect,
}

impl Outside {
    fn open(dir: &Path, role: Role) -> Outside {
        let ledger = Connection::open(dir.join("ledger.db")).unwrap();
        ledger.busy_timeout(Duration::from_secs(10)).unwrap();
        ledger.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, refund_order TEXT NOT NULL, pid INTEGER NOT NULL)").unwrap();
        Outside {
            ledger: Mutex::new(ledger),
            role,
            executions: AtomicUsize::new(0),
            marker: dir.join("marker"),
        }
    }

    fn refund(&self, order: &str) {
        self.ledger
            .lock()
            .unwrap()
            .execute(
                "INSERT INTO refunds (refund_order, pid) VALUES (?1, ?2)",
                rusqlite::params![order, std::process::id()],
            )
            .unwrap();
    }

    fn count(&self, order: Option<&str>) -> usize {
        let ledger = self.ledger.lock().unwrap();
        let n: i64 = match order {
            Some(order) => ledger.query_row(
                "SELECT COUNT(*) FROM refunds WHERE refund_order = ?1",
                [order],
                |r| r.get(0),
            ),
            None => ledger.query_row("SELECT COUNT(*) FROM refunds", [], |r| r.get(0)),
        }
        .unwrap();
        n as usize
    }

    async fn act(&self, order: &str) -> String {
        self.executions.fetch_add(1, Ordering::SeqCst);
        match self.role {
            Role::Normal => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.refund(order);
            }
            Role::HangBeforeEffect => {
                std::fs::write(&self.marker, "reserved").unwrap();
                std::future::pending::<()>().await;
            }
            Role::HangAfterEffect => {
                self.refund(order);
                std::fs::write(&self.marker, "acted").unwrap();
                std::future::pending::<()>().await;
            }
        }
        format!("refund-of-{order}")
    }
}

/// Refund an order (no recover hook).
#[tool(
    idempotent(key = "refund:<order>"),
    lease = "1s",
    name = "refund_blind"
)]
async fn refund_blind(outside: State<Outside>, order: String) -> Result<String, ToolError> {
    Ok(outside.act(&order).await)
}

/// Refund an order; after a crash, look the refund up before acting again.
#[tool(idempotent(key = "refund:<order>", recover = look_up), lease = "1s")]
async fn refund(outside: State<Outside>, order: String) -> Result<String, ToolError> {
    Ok(outside.act(&order).await)
}

async fn look_up(outside: State<Outside>, order: String) -> Result<Option<String>, ToolError> {
    Ok((outside.count(Some(&order)) > 0).then(|| format!("refund-of-{order} (found by lookup)")))
}

fn toolbox(dir: &Path, role: Role) -> (Toolbox, Arc<Outside>) {
    let outside = Arc::new(Outside::open(dir, role));
    let toolbox = Toolbox::builder()
        .store(SqliteStore::open(dir.join("toolkey.db")).unwrap())
        .shared_state(outside.clone())
        .tool(RefundBlind)
        .tool(Refund)
        .build()
        .unwrap();
    (toolbox, outside)
}

fn ctx() -> ToolContext {
    ToolContext::new("run-1").with_tenant("shop")
}

fn spawn_child(dir: &Path, mode: &str, tool: &str) -> Child {
    child::spawn_self(&[
        ("TOOLKEY_CHILD", mode.as_ref()),
        ("TOOLKEY_CHILD_DIR", dir.as_os_str()),
        ("TOOLKEY_CHILD_TOOL", tool.as_ref()),
    ])
}

/// The child's part, when this binary runs as a child process; nothing otherwise.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("TOOLKEY_CHILD") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("TOOLKEY_CHILD_DIR").unwrap());
    let tool = std::env::var("TOOLKEY_CHILD_TOOL").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let role = match mode.as_str() {
            "hang-before" => Role::HangBeforeEffect,
            "hang-after" => Role::HangAfterEffect,
            _ => Role::Normal,
        };
        let (toolbox, _) = toolbox(&dir, role);
        if role != Role::Normal {
            let _ = toolbox.call(&tool, json!({"order": "o-1"}), &ctx()).await;
            return;
        }
        // Many tasks, every key several times, racing the other process.
        let mut tasks = Vec::new();
        for task in 0..8 {
            let toolbox = toolbox.clone();
            let tool = tool.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..3 {
                    for k in 0..20 {
                        let order = format!("o-{}", (k + task + round) % 20);
                        match toolbox.call(&tool, json!({"order": order}), &ctx()).await {
                            Ok(_) => {}
                            Err(err) if err.is(ErrorCode::InProgress) => {}
                            Err(err) => panic!("unexpected {err:?}"),
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert!(toolbox.shutdown().await.is_clean());
    });
}

#[test]
fn two_processes_through_one_sqlite_file_execute_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let _ = Outside::open(dir.path(), Role::Normal); // create the ledger before the race
    let mut children = [
        spawn_child(dir.path(), "race", "refund"),
        spawn_child(dir.path(), "race", "refund"),
    ];
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let outside = Outside::open(dir.path(), Role::Normal);
    assert_eq!(outside.count(None), 20, "exactly one refund per key");
    for k in 0..20 {
        assert_eq!(outside.count(Some(&format!("o-{k}"))), 1);
    }
}

/// Starts a child that reserves `o-1` and hangs, waits for its signal, and kills it.
fn kill_a_child_holding_the_key(dir: &Path, mode: &str, tool: &str) {
    let _ = Outside::open(dir, Role::Normal);
    let mut child = spawn_child(dir, mode, tool);
    child::wait_for(&dir.join("marker"), "the child never reached its body");
    child.kill().unwrap(); // SIGKILL: no destructor, no release
    child.wait().unwrap();
}

async fn after_the_lease_lapses(
    toolbox: &Toolbox,
    tool: &str,
) -> Result<toolkey::ToolOutput, ToolError> {
    let err = toolbox
        .call(tool, json!({"order": "o-1"}), &ctx())
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorCode::InProgress),
        "while the dead worker's lease runs: {err:?}"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    toolbox.call(tool, json!({"order": "o-1"}), &ctx()).await
}

#[tokio::test]
async fn a_killed_worker_without_a_hook_leaves_outcome_unknown() {
    let dir = tempfile::tempdir().unwrap();
    kill_a_child_holding_the_key(dir.path(), "hang-after", "refund_blind");
    let (toolbox, outside) = toolbox(dir.path(), Role::Normal);
    let err = after_the_lease_lapses(&toolbox, "refund_blind")
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::OutcomeUnknown), "{err:?}");
    assert_eq!(outside.executions.load(Ordering::SeqCst), 0);
    assert_eq!(outside.count(None), 1, "only the dead worker's refund");
}

#[tokio::test]
async fn a_killed_worker_whose_lookup_finds_nothing_is_run_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    kill_a_child_holding_the_key(dir.path(), "hang-before", "refund");
    let (toolbox, outside) = toolbox(dir.path(), Role::Normal);
    let out = after_the_lease_lapses(&toolbox, "refund").await.unwrap();
    assert_eq!(out.value, json!("refund-of-o-1"));
    assert!(
        toolbox
            .call("refund", json!({"order": "o-1"}), &ctx())
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(outside.executions.load(Ordering::SeqCst), 1);
    assert_eq!(outside.count(None), 1);
}

#[tokio::test]
async fn a_killed_worker_whose_lookup_finds_the_effect_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    kill_a_child_holding_the_key(dir.path(), "hang-after", "refund");
    let (toolbox, outside) = toolbox(dir.path(), Role::Normal);
    let out = after_the_lease_lapses(&toolbox, "refund").await.unwrap();
    assert_eq!(out.value, json!("refund-of-o-1 (found by lookup)"));
    assert_eq!(outside.executions.load(Ordering::SeqCst), 0);
    assert_eq!(outside.count(None), 1);
}
