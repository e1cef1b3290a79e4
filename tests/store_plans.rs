//! The PostgreSQL store's reserve statement, read through the server's planner: on a table that
//! holds many expired records no purge has removed, with autovacuum off and no `ANALYZE` ever
//! run, a reserve of a live key, of a new key and of an expired key reads the key's primary-key
//! entries and nothing of the history around it.
//!
//! The server is `TOOLKEY_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

use std::time::Duration;

use serde_json::{json, Value};
use toolkey::store::{Outcome, PostgresStore, RecordKey, Reservation, Reservations, Token};
use toolkey::Fingerprint;
use toolkey_tests::servers;

const VAR: &str = "TOOLKEY_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const SCHEMA: &str = "toolkey_plans";
const TENANT: &str = "plans";
/// Expired, completed records waiting for a purge, and as many ended failure counters.
const EXPIRED: i64 = 200_000;
/// Shared buffers a reserve may touch: a few B-tree levels per lookup of the primary keys (the
/// records' and the failure counters'), the row, and the new row's insert. The expiry index of
/// `EXPIRED` entries alone spans hundreds of pages.
const MAX_BUFFERS: i64 = 48;

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn fp() -> Fingerprint {
    Fingerprint::of(&json!({"n": 1})).unwrap()
}

/// Every plan node under `node`, itself included.
fn nodes<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(node);
    for child in node["Plans"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

/// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of the prepared reserve statement for `key`, as a
/// custom or a generic plan, in a transaction rolled back afterwards. The top plan node.
async fn explain(client: &mut tokio_postgres::Client, key: &str, generic: bool) -> Value {
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&format!("SET LOCAL plan_cache_mode = {mode}"))
        .await
        .unwrap();
    let answer = tx
        .simple_query(&format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
             EXECUTE toolkey_reserve_plan('{TENANT}', '{key}', 'plan-token', 'fp', 60000, 'tool')"
        ))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let text = answer
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    let plan: Value = serde_json::from_str(&text).unwrap();
    plan[0]["Plan"].clone()
}

/// What the plan of a reserve of `key` must show: every index it reads is a primary key, no
/// table is scanned whole, no node throws away more than the one row it looked up, the shared
/// buffers touched stay under [`MAX_BUFFERS`], and `rows` rows come back.
fn check(plan: &Value, key: &str, generic: bool, table: &str, rows: u64) {
    let what = format!("the reserve of {key:?} (generic plan: {generic})");
    let mut all = Vec::new();
    nodes(plan, &mut all);
    let keys = [format!("{table}_pkey"), format!("{table}_failures_pkey")];
    for node in &all {
        let kind = node["Node Type"].as_str().unwrap();
        assert_ne!(kind, "Seq Scan", "{what} scans a table: {plan:#}");
        if let Some(index) = node["Index Name"].as_str() {
            assert!(
                keys.iter().any(|k| k == index),
                "{what} reads the index {index}: {plan:#}"
            );
        }
        for removed in ["Rows Removed by Filter", "Rows Removed by Index Recheck"] {
            let n = node[removed].as_u64().unwrap_or(0);
            assert!(n <= 1, "{what}: {kind} with {removed} {n}: {plan:#}");
        }
    }
    let buffers =
        plan["Shared Hit Blocks"].as_i64().unwrap() + plan["Shared Read Blocks"].as_i64().unwrap();
    assert!(
        buffers <= MAX_BUFFERS,
        "{what} touched {buffers} shared buffers: {plan:#}"
    );
    assert_eq!(plan["Actual Rows"].as_u64(), Some(rows), "{what}: {plan:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_reads_the_primary_key_alone_on_a_table_full_of_expired_records() {
    let url = servers::url(VAR, DEFAULT_URL);
    let table = format!("plans_{}", std::process::id());
    let store = match PostgresStore::builder(&url)
        .schema(SCHEMA)
        .table(&table)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
    {
        Ok(store) => store,
        Err(e) => return servers::unreachable("PostgreSQL", VAR, &url, e),
    };
    let mut admin = admin(&url).await;
    let (records, failures) = (
        format!("{SCHEMA}.\"{table}\""),
        format!("{SCHEMA}.\"{table}_failures\""),
    );
    admin
        .batch_execute(&format!(
            "ALTER TABLE {records} SET (autovacuum_enabled = false);
             ALTER TABLE {failures} SET (autovacuum_enabled = false);
             INSERT INTO {records} (tenant, key, state, token, fingerprint, since, lease_until,
                 outcome, completed_at, expires_at, tool)
             SELECT '{TENANT}', 'expired-' || lpad(g::text, 7, '0'), 'completed', 't-' || g,
                 'fp', now() - interval '2 days', now() - interval '2 days', '7',
                 now() - interval '2 days', now() - interval '1 day' + g * interval '1 ms', 'tool'
             FROM generate_series(1, {EXPIRED}) g;
             INSERT INTO {failures} (tenant, key, failures, ends_at)
             SELECT '{TENANT}', 'expired-' || lpad(g::text, 7, '0'), 1,
                 now() - interval '1 day' + g * interval '1 ms'
             FROM generate_series(1, {EXPIRED}) g;"
        ))
        .await
        .unwrap();
    // A live record, completed through the store, and a failure counter beside it.
    let live = RecordKey::new(TENANT, "live");
    let Reservation::Reserved { token, .. } = store
        .reserve(
            &live,
            "tool",
            &fp(),
            &Token::generate(),
            Duration::from_secs(60),
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key was taken")
    };
    assert!(store
        .complete(
            &live,
            &token,
            &Outcome::Ok(json!(7)),
            Duration::from_secs(3600)
        )
        .await
        .unwrap());
    admin
        .batch_execute(&format!(
            "INSERT INTO {failures} VALUES ('{TENANT}', 'live', 2, now() + interval '1 hour');
             PREPARE toolkey_reserve_plan(text, text, text, text, int8, text) AS {}",
            store.__reserve_statement()
        ))
        .await
        .unwrap();
    // Never analysed, never vacuumed: the planner knows nothing of the rows.
    let never: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname = $2
               AND last_analyze IS NULL AND last_autoanalyze IS NULL
               AND last_vacuum IS NULL AND last_autovacuum IS NULL",
            &[&SCHEMA, &table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(never, 1);

    // Never analysed, then analysed (the planner then knows the history is there).
    for analysed in [false, true] {
        if analysed {
            admin
                .batch_execute(&format!("ANALYZE {records}; ANALYZE {failures};"))
                .await
                .unwrap();
        }
        for generic in [false, true] {
            // A replay: the live record comes back, nothing written.
            let plan = explain(&mut admin, "live", generic).await;
            check(&plan, "live", generic, &table, 1);
            // A first call: the new key's row inserted.
            let plan = explain(&mut admin, "new", generic).await;
            check(&plan, "new", generic, &table, 1);
            // An expired key reused: its record taken over in place.
            let plan = explain(&mut admin, "expired-0100000", generic).await;
            check(&plan, "expired-0100000", generic, &table, 1);
        }
    }
    // The rolled-back reserves left the table as it was: the expired record is still there.
    let left: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM {records} WHERE state = 'completed'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, EXPIRED + 1);

    admin
        .batch_execute(&format!(
            "DEALLOCATE toolkey_reserve_plan;
             DROP TABLE {records}; DROP TABLE {failures};
             DELETE FROM {SCHEMA}.toolkey_schema_version WHERE table_name = '{table}';"
        ))
        .await
        .unwrap();
}
