//! The statements of one table, written once when the store is built.

use super::*;

/// A validated SQL identifier and its quoted form.
#[derive(Debug)]
pub(super) struct Ident {
    pub(super) name: String,
    pub(super) quoted: String,
}

impl Ident {
    pub(super) fn new(what: &str, name: &str, max: usize) -> Result<Ident, StoreError> {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.len() <= max;
        if !valid {
            return Err(StoreError::Config(format!(
                "postgres: invalid {what} name {name:?}: expected a letter or `_`, then letters, \
                 digits or `_`, at most {max} bytes"
            )));
        }
        Ok(Ident {
            name: name.to_string(),
            quoted: format!("\"{name}\""),
        })
    }
}

/// The statements of one table, written once when the store is built.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) schema: Option<Ident>,
    /// The table's name, as the version table keys it.
    pub(super) table_name: String,
    /// The table, quoted and qualified.
    pub(super) table: String,
    pub(super) versions: String,
    pub(super) create: String,
    /// The migration from version 1.
    pub(super) add_tool: String,
    pub(super) reserve: String,
    pub(super) read: String,
    pub(super) complete: String,
    pub(super) completed_by: String,
    pub(super) release: String,
    pub(super) renew: String,
    pub(super) mark_unknown: String,
    pub(super) take_over: String,
    pub(super) purge: String,
    pub(super) list: String,
    pub(super) resolve_done: String,
    pub(super) resolve_not_done: String,
    pub(super) now: String,
    // Retry limits: the failure counters' table and statements.
    pub(super) failures_table: String,
    pub(super) failures_create: String,
    pub(super) count_failure: String,
    pub(super) failures: String,
    pub(super) clear_failures: String,
    // Approval requests: their table and statements.
    pub(super) approvals: super::approvals::ApprovalSql,
}

impl Sql {
    pub(super) fn new(schema: Option<Ident>, table: Ident) -> Sql {
        let qualify = |name: &str| match &schema {
            Some(s) => format!("{}.{name}", s.quoted),
            None => name.to_string(),
        };
        let t = qualify(&table.quoted);
        let index = format!("\"{}_expires_at\"", table.name);
        let ms = |column: &str| format!("(extract(epoch FROM {column}) * 1000)::int8");
        // In progress, or resolved as not done while the token held it: a holder an operator
        // judged dead that was alive after all still records what it did.
        let fenced = format!(
            "tenant = $1 AND key = $2 AND token = $3 AND state IN ('{IN_PROGRESS}', '{NOT_DONE}')"
        );
        // A record's columns and the server's clock, as `stored_at` reads them.
        let columns = format!(
            "state, token, fingerprint, {}, {}, outcome, {}, {}, {}, tool",
            ms("since"),
            ms("lease_until"),
            ms("completed_at"),
            ms("expires_at"),
            ms(NOW),
        );
        let resolvable = format!(
            "tenant = $1 AND key = $2 AND token = $3
             AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW}))"
        );
        let f = qualify(&format!("\"{}_failures\"", table.name));
        let f_index = format!("\"{}_failures_ends\"", table.name);
        let after = |ms: &str| format!("{NOW} + {ms}::int8 * interval '1 millisecond'");
        // Expiry and counter windows are judged on the row the primary key found, inside a
        // CASE that no index matches: the only index a statement's WHERE leaves the planner is
        // the primary key, so a lookup reads one key's entries however many expired records
        // or ended counters wait for a purge, on a table never analysed.
        let replaceable = format!(
            "CASE state WHEN '{COMPLETED}' THEN expires_at <= {NOW} WHEN '{NOT_DONE}' THEN true
                 ELSE false END"
        );
        let live_failures = format!("CASE WHEN ends_at > {NOW} THEN failures END");
        Sql {
            approvals: super::approvals::ApprovalSql::new(
                &qualify(&format!("\"{}_approvals\"", table.name)),
                &table.name,
            ),
            failures_create: format!(
                "CREATE TABLE IF NOT EXISTS {f} (
                     tenant   text NOT NULL,
                     key      text NOT NULL,
                     failures int8 NOT NULL,
                     ends_at  timestamptz NOT NULL,
                     PRIMARY KEY (tenant, key)
                 );
                 CREATE INDEX IF NOT EXISTS {f_index} ON {f} (ends_at);"
            ),
            // One statement: a few ended counters of other keys swept (never this key's row, which
            // the upsert may be changing in the same statement), then this key's counter
            // inserted, restarted (its window ended) or added to. Concurrent counts of one key
            // queue on its row lock, and each reads the count the one before it left.
            count_failure: format!(
                "WITH swept AS (
                     DELETE FROM {f} WHERE (tenant, key) IN (
                         SELECT tenant, key FROM {f}
                         WHERE ends_at <= {NOW} AND NOT (tenant = $1 AND key = $2)
                         LIMIT 64 FOR UPDATE SKIP LOCKED)
                 )
                 INSERT INTO {f} AS f (tenant, key, failures, ends_at)
                 VALUES ($1, $2, 1, {window})
                 ON CONFLICT (tenant, key) DO UPDATE SET
                     failures = CASE WHEN f.ends_at <= {NOW} THEN 1 ELSE f.failures + 1 END,
                     ends_at = CASE WHEN f.ends_at <= {NOW} THEN excluded.ends_at ELSE f.ends_at END
                 RETURNING failures",
                window = after("$3"),
            ),
            failures: format!("SELECT {live_failures} FROM {f} WHERE tenant = $1 AND key = $2"),
            clear_failures: format!("DELETE FROM {f} WHERE tenant = $1 AND key = $2"),
            failures_table: f.clone(),
            versions: qualify("toolkey_schema_version"),
            create: format!(
                "CREATE TABLE {t} (
                     tenant       text NOT NULL,
                     key          text NOT NULL,
                     state        text NOT NULL,
                     token        text NOT NULL,
                     fingerprint  text NOT NULL,
                     since        timestamptz NOT NULL,
                     lease_until  timestamptz NOT NULL,
                     outcome      text,
                     completed_at timestamptz,
                     expires_at   timestamptz,
                     tool         text,
                     PRIMARY KEY (tenant, key)
                 );
                 CREATE INDEX {index} ON {t} (expires_at) WHERE state = '{COMPLETED}';"
            ),
            // One round trip whatever the answer: the takeover of an expired record or the
            // insert of a new one (with the key's failure count, for retry limits), else the
            // record in the way, read in the same statement. A
            // live record is neither locked nor written (no transaction id, no WAL flush): a
            // replay costs a read. The read sees the statement's snapshot, so a record committed
            // by another call after it began is not there: no row, and the caller reads again.
            reserve: format!(
                "WITH expired AS (
                     UPDATE {t} SET
                         state = '{IN_PROGRESS}', token = $3, fingerprint = $4, since = {NOW}, tool = $6,
                         lease_until = {NOW} + $5::int8 * interval '1 millisecond',
                         outcome = NULL, completed_at = NULL, expires_at = NULL
                     WHERE tenant = $1 AND key = $2 AND {replaceable}
                     RETURNING 1
                 ), inserted AS (
                     INSERT INTO {t} (tenant, key, state, token, fingerprint, since, lease_until, tool)
                     VALUES ($1, $2, '{IN_PROGRESS}', $3, $4, {NOW}, {NOW} + $5::int8 * interval '1 millisecond', $6)
                     ON CONFLICT (tenant, key) DO NOTHING
                     RETURNING 1
                 ), reserved AS (
                     SELECT 1 FROM expired UNION ALL SELECT 1 FROM inserted
                 )
                 SELECT true, NULL::text, NULL::text, NULL::text, NULL::int8, NULL::int8,
                        NULL::text, NULL::int8, NULL::int8, NULL::int8, NULL::text,
                        (SELECT {live_failures} FROM {f} WHERE tenant = $1 AND key = $2)
                 FROM reserved
                 UNION ALL
                 SELECT false, {columns}, NULL::int8
                 FROM {t} WHERE tenant = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM reserved)"
            ),
            read: format!("SELECT {columns} FROM {t} WHERE tenant = $1 AND key = $2"),
            complete: format!(
                "UPDATE {t} SET state = '{COMPLETED}', outcome = $4, completed_at = {NOW},
                     expires_at = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE {fenced}"
            ),
            completed_by: format!(
                "SELECT 1 FROM {t} WHERE tenant = $1 AND key = $2 AND token = $3
                   AND state = '{COMPLETED}' AND outcome = $4"
            ),
            release: format!("DELETE FROM {t} WHERE {fenced}"),
            renew: format!(
                "UPDATE {t} SET state = '{IN_PROGRESS}',
                     lease_until = {NOW} + $4::int8 * interval '1 millisecond'
                 WHERE {fenced}"
            ),
            mark_unknown: format!("UPDATE {t} SET state = '{UNKNOWN}' WHERE {fenced}"),
            take_over: format!(
                "UPDATE {t} SET state = '{IN_PROGRESS}', token = $4, since = {NOW},
                     lease_until = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE tenant = $1 AND key = $2 AND token = $3
                   AND (state = '{UNKNOWN}' OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW}))"
            ),
            add_tool: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS tool text"),
            // The outer condition repeats the inner one: a row a call's reserve replaced after
            // the subquery read it (an expired record, now that call's reservation) is
            // re-checked by the outer condition alone, and must not be deleted under its body.
            purge: format!(
                "DELETE FROM {t} WHERE (tenant, key) IN (
                     SELECT tenant, key FROM {t}
                     WHERE state = '{COMPLETED}' AND expires_at <= {NOW} LIMIT $1)
                   AND state = '{COMPLETED}' AND expires_at <= {NOW}"
            ),
            // After the cursor, narrowed by every filter the table can judge (the rest,
            // completed against failed, is judged on the rows read).
            list: format!(
                "SELECT tenant, key, {columns} FROM {t}
                 WHERE ($1::text IS NULL OR (tenant, key) > ($1::text, $2::text))
                   AND ($3::text IS NULL OR tenant = $3)
                   AND ($4::text IS NULL OR tool = $4)
                   AND ($5::text IS NULL OR key = $5)
                   AND ($6::int8 IS NULL OR since <= {NOW} - $6::int8 * interval '1 millisecond')
                   AND ($7::text IS NULL
                        OR ($7 = 'in_progress' AND state = '{IN_PROGRESS}' AND lease_until > {NOW})
                        OR ($7 = 'unknown' AND (state = '{UNKNOWN}'
                            OR (state = '{IN_PROGRESS}' AND lease_until <= {NOW})))
                        OR ($7 IN ('completed', 'failed') AND state = '{COMPLETED}'
                            AND expires_at > {NOW}))
                 ORDER BY tenant, key
                 LIMIT $8"
            ),
            resolve_done: format!(
                "UPDATE {t} SET state = '{COMPLETED}', outcome = $4, completed_at = {NOW},
                     expires_at = {NOW} + $5::int8 * interval '1 millisecond'
                 WHERE {resolvable}"
            ),
            resolve_not_done: format!("UPDATE {t} SET state = '{NOT_DONE}' WHERE {resolvable}"),
            now: format!("SELECT {}", ms(NOW)),
            schema,
            table_name: table.name,
            table: t,
        }
    }
}
