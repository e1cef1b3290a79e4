//! Two OS processes sharing a store share one count: the second process gets only the attempts
//! the first one left.

use std::time::Duration;

use toolkey::ErrorCode;
use toolkey_tests::child;

use super::{builder, charge_args, ctx, open_store, tenant, Gateway, ScriptedModel};

/// This process fails the charge three times; a second process then repeats it fifty times and
/// gets two attempts before `RETRY_LIMIT`; back here, the next call is refused without one.
async fn two_processes_share_the_count(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(store) = open_store(kind, dir.path()).await else {
        return;
    };
    let tenant = tenant();
    let gateway = Gateway::with_ledger(dir.path());
    let toolbox = builder(&gateway).shared_store(store).build().unwrap();
    let here =
        ScriptedModel::repeat(&toolbox, "charge", charge_args("o-1"), &ctx(&tenant), 3).await;
    assert_eq!(here.count("GATEWAY_BUSY"), 3);

    let mut child = child::spawn_self(&[
        ("TOOLKEY_CHILD", kind.as_ref()),
        ("TOOLKEY_CHILD_DIR", dir.path().as_os_str()),
        ("TOOLKEY_CHILD_TENANT", tenant.as_ref()),
        ("TOOLKEY_CHILD_CALLS", "50".as_ref()),
    ]);
    let status = child::finish(
        &mut child,
        Duration::from_secs(60),
        "the child's fifty calls",
    );
    assert!(status.success());
    let answers = std::fs::read_to_string(dir.path().join("answers")).unwrap();
    let answers: Vec<&str> = answers.lines().collect();
    assert_eq!(answers.len(), 50);
    assert_eq!(
        &answers[..2],
        ["GATEWAY_BUSY", "RETRY_LIMIT"],
        "{answers:?}"
    );
    assert!(
        answers[1..].iter().all(|a| *a == "RETRY_LIMIT"),
        "{answers:?}"
    );

    let err = toolbox
        .call("charge", charge_args("o-1"), &ctx(&tenant))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::RetryLimit), "{err:?}");
    assert_eq!(gateway.attempts("charge:o-1"), 3, "this process's attempts");
    assert_eq!(
        gateway.ledger_attempts("charge:o-1"),
        5,
        "both processes' attempts"
    );
}

#[cfg(all(feature = "sqlite", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_sqlite() {
    two_processes_share_the_count("sqlite").await;
}

#[cfg(all(feature = "postgres", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_postgres() {
    two_processes_share_the_count("postgres").await;
}

#[cfg(all(feature = "redis", unix))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_redis() {
    two_processes_share_the_count("redis").await;
}
