//! The `toolkey` command: what an on-call engineer runs when a model was told "the outcome is
//! unknown, ask a person".
//!
//! ```text
//! toolkey --store sqlite:toolkey.db list --state unknown
//! toolkey --store postgres://db/agents show --tenant acme --key invoice:acme:2026-10
//! toolkey --store redis://cache resolve --tenant acme --key invoice:acme:2026-10 \
//!     --revision 6f1c…-2a --done --result '{"invoice": "inv-1042"}'
//! toolkey --store sqlite:toolkey.db purge
//! ```
//!
//! `resolve` names the revision `list` or `show` printed, and is refused when the record changed
//! since (another operator resolved it, a retry took it over, its worker was alive after all) or
//! is not unknown: nothing this command does can make a stuck key worse.
//!
//! The binary is a thin `main` around [`run`], which tests drive directly.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod approvals;

use clap::{Args, Parser, Subcommand};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::{json, Value};
use toolkey::admin::{Admin, Resolved, MIN_RETAIN};
use toolkey::store::{
    Entry, EntryState, Filter, Outcome, PostgresStore, RecordKey, RedisStore, Resolution,
    SqliteStore, Store, StoreError, Token, Unreadable,
};

/// What the command ended in, as its exit code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done (0).
    Done = 0,
    /// The store failed or refused its configuration (1).
    Failed = 1,
    /// The command line was wrong (2).
    Usage = 2,
    /// A resolution or a decision was refused: the record is not the unknown record that was
    /// shown, or the approval request is not the pending one that was shown (3).
    Refused = 3,
    /// `show` found no record, or a decision no request of that revision (4).
    NotFound = 4,
}

#[derive(Debug, Parser)]
#[command(
    name = "toolkey",
    version,
    about = "List, show, resolve and purge toolkey's idempotency records; decide approvals"
)]
struct Cli {
    /// The store: `sqlite:<path>` (or a path to an existing file), `postgres://...` or
    /// `redis://...`.
    #[arg(long, env = "TOOLKEY_STORE", global = true)]
    store: Option<String>,
    /// PostgreSQL: the table's schema.
    #[arg(long, global = true)]
    schema: Option<String>,
    /// PostgreSQL: the table (default `toolkey_records`).
    #[arg(long, global = true)]
    table: Option<String>,
    /// Redis: the key prefix (default `toolkey`).
    #[arg(long, global = true)]
    prefix: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists records, in tenant and key order.
    List(ListArgs),
    /// Shows one record, with its revision and outcome.
    Show(KeyArgs),
    /// Settles an unknown record as done (a retry replays the result) or not done (a retry
    /// runs it once).
    Resolve(ResolveArgs),
    /// Deletes expired records in batches.
    Purge(PurgeArgs),
    /// Counts records by tool and state.
    Counts(FilterArgs),
    /// Forgets a call's counted failures, so a call stopped by its retry limit (RETRY_LIMIT)
    /// runs again before its window ends. Use it once the cause of the failures is fixed.
    ClearFailures(KeyArgs),
    /// Lists, shows, approves and denies the approval requests of calls that wait for a person.
    Approvals(approvals::ApprovalsArgs),
}

#[derive(Debug, Args)]
struct FilterArgs {
    /// Only this tenant's records.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this tool's records (`send_invoice`, or a step: `send_invoice/email`).
    #[arg(long)]
    tool: Option<String>,
    /// Only records in this state: in_progress, unknown, completed, failed.
    #[arg(long)]
    state: Option<EntryState>,
    /// Only records reserved at least this long ago (`90s`, `10m`, `2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The record's tenant (empty when calls set none).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    tenant: String,
    /// The record's key, as `list` prints it (a value that starts with `-` is still the key).
    #[arg(long, allow_hyphen_values = true)]
    key: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("finding").required(true).args(["done", "not_done"])))]
struct ResolveArgs {
    #[command(flatten)]
    record: KeyArgs,
    /// The revision `list` or `show` printed: the resolution is refused if the record changed
    /// since.
    #[arg(long, allow_hyphen_values = true)]
    revision: String,
    /// The work was done: a retry replays `--result`.
    #[arg(long, requires = "result")]
    done: bool,
    /// The work was not done: a retry runs it once (if its worker was alive after all and
    /// records its outcome first, the retry replays that instead). Only once the worker is known
    /// to have stopped: a stalled one that has not acted yet may still act after the retry ran.
    #[arg(long)]
    not_done: bool,
    /// The result a retry replays, as JSON (what the tool would have returned).
    #[arg(long, value_parser = parse_json, allow_hyphen_values = true)]
    result: Option<Value>,
    /// How long a record resolved as done is kept, so that the model's retry replays it: at
    /// least 1h.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
    retain: Duration,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// Records deleted per batch; calls are answered between batches.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
}

/// The refusal of a retention too short for the promise `resolve --done` makes.
fn retain_too_short(retain: Duration) -> String {
    format!(
        "--retain {} would let the record expire before the model's retry comes, and that retry \
         would do the work again; nothing was changed: keep it at least {} (`--retain {}`), or \
         leave --retain out to keep it 7 days",
        humantime::format_duration(retain),
        humantime::format_duration(MIN_RETAIN),
        humantime::format_duration(MIN_RETAIN)
    )
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

/// Runs the command line `args` (the program's name first), writing what it prints to `out`
/// and errors to `err`.
pub async fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> Exit
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.render().to_string();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    let _ = write!(out, "{text}");
                    Exit::Done
                }
                _ => {
                    let _ = write!(err, "{text}");
                    Exit::Usage
                }
            };
        }
    };
    match execute(cli, out).await {
        Ok(exit) => exit,
        Err(Failure::Usage(why)) => {
            let _ = writeln!(err, "error: {why}");
            Exit::Usage
        }
        Err(Failure::Store(e)) => {
            let _ = writeln!(err, "error: {e}");
            Exit::Failed
        }
        Err(Failure::Io(e)) => {
            let _ = writeln!(err, "error: cannot write the output: {e}");
            Exit::Failed
        }
        Err(Failure::Unreadable(records)) => {
            for record in &records {
                let _ = writeln!(err, "error: {record}");
            }
            let _ = writeln!(
                err,
                "error: {} record(s) above could not be read and are not listed: they are left \
                 as they are; repair or delete them in the store by hand",
                records.len()
            );
            Exit::Failed
        }
    }
}

enum Failure {
    Usage(String),
    Store(StoreError),
    Io(std::io::Error),
    /// Records a listing met and could not read.
    Unreadable(Vec<Unreadable>),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

async fn execute(cli: Cli, out: &mut dyn Write) -> Result<Exit, Failure> {
    let store = open(&cli).await?;
    let admin = Admin::new(store.clone());
    match cli.command {
        Command::List(args) => {
            let filter = filter(args.filter);
            let listing = admin.listing(&filter, args.limit).await?;
            let now = store.now().await?;
            let entries = &listing.entries;
            if cli.json {
                let rows: Vec<Value> = entries.iter().map(|e| entry_json(e, now)).collect();
                writeln!(out, "{}", Value::Array(rows))?;
            } else {
                write_list(out, entries, now)?;
            }
            // Every record that could be read is listed; the ones that could not are named on
            // the error stream, and the command fails.
            if listing.unreadable.is_empty() {
                Ok(Exit::Done)
            } else {
                Err(Failure::Unreadable(listing.unreadable))
            }
        }
        Command::Show(args) => {
            let key = RecordKey::new(args.tenant, args.key);
            let now = store.now().await?;
            let failures = store.failures(&key).await?;
            match admin.show(&key).await? {
                Some(entry) if cli.json => {
                    let mut shown = entry_json(&entry, now);
                    shown["failures"] = json!(failures);
                    writeln!(out, "{shown}")?
                }
                Some(entry) => {
                    write_entry(out, &entry, now)?;
                    writeln!(
                        out,
                        "failures:    {failures} in the current retry-limit window"
                    )?;
                }
                None => {
                    if cli.json {
                        writeln!(out, "null")?;
                    } else {
                        writeln!(
                            out,
                            "no record (tenant {}, key {}); {failures} failures counted in \
                             the current retry-limit window",
                            word(&key.tenant),
                            word(&key.key)
                        )?;
                    }
                    return Ok(Exit::NotFound);
                }
            }
            Ok(Exit::Done)
        }
        Command::ClearFailures(args) => {
            let key = RecordKey::new(args.tenant, args.key);
            let failures = store.failures(&key).await?;
            store.clear_failures(&key).await?;
            if cli.json {
                writeln!(out, "{}", json!({ "cleared": failures }))?;
            } else {
                writeln!(
                    out,
                    "cleared {failures} counted failures: the call runs again when asked"
                )?;
            }
            Ok(Exit::Done)
        }
        Command::Resolve(args) => {
            let key = RecordKey::new(args.record.tenant, args.record.key);
            if args.done && args.retain < MIN_RETAIN {
                return Err(Failure::Usage(retain_too_short(args.retain)));
            }
            let resolution = match (args.done, args.result) {
                (true, Some(result)) => Resolution::Done {
                    outcome: Outcome::Ok(result),
                    retain: args.retain,
                },
                (true, None) => return Err(Failure::Usage("--done needs --result".into())),
                (false, _) => Resolution::NotDone,
            };
            let seen = Token::from_stored(args.revision);
            let resolved = admin.resolve(&key, &seen, &resolution).await?;
            let now = store.now().await?;
            write_resolved(out, cli.json, &resolution, &resolved, now)?;
            Ok(match resolved {
                Resolved::Applied => Exit::Done,
                Resolved::Refused { .. } => Exit::Refused,
                Resolved::RetainTooShort { .. } => Exit::Usage,
            })
        }
        Command::Purge(args) => {
            let bar = (!cli.json).then(|| {
                let bar = indicatif::ProgressBar::new_spinner();
                bar.set_style(
                    indicatif::ProgressStyle::with_template("{spinner} purged {pos} records")
                        .expect("a valid template"),
                );
                bar
            });
            let purged = admin
                .purge(args.batch, |total| {
                    if let Some(bar) = &bar {
                        bar.set_position(total);
                    }
                })
                .await?;
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            if cli.json {
                writeln!(out, "{}", json!({ "purged": purged }))?;
            } else {
                writeln!(out, "purged {purged} expired records")?;
            }
            Ok(Exit::Done)
        }
        Command::Approvals(args) => approvals::execute(args, &admin, &store, cli.json, out).await,
        Command::Counts(args) => {
            let counts = admin.counts(&filter(args)).await?;
            if cli.json {
                let rows: Vec<Value> = counts
                    .iter()
                    .map(|((tool, state), n)| json!({"tool": tool, "state": state.as_str(), "count": n}))
                    .collect();
                writeln!(out, "{}", Value::Array(rows))?;
            } else {
                let mut table = table(["TOOL", "STATE", "COUNT"]);
                for ((tool, state), n) in &counts {
                    table.add_row([tool_name(tool.as_deref()), state.to_string(), n.to_string()]);
                }
                writeln!(out, "{table}")?;
            }
            Ok(Exit::Done)
        }
    }
}

/// Opens the store the command line names.
async fn open(cli: &Cli) -> Result<Arc<dyn Store>, Failure> {
    let Some(url) = cli.store.as_deref() else {
        return Err(Failure::Usage(
            "name the store with --store (or TOOLKEY_STORE): sqlite:<path>, postgres://... or \
             redis://..."
                .into(),
        ));
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut builder = PostgresStore::builder(url);
        if let Some(schema) = &cli.schema {
            builder = builder.schema(schema);
        }
        if let Some(table) = &cli.table {
            builder = builder.table(table);
        }
        return Ok(Arc::new(builder.connect().await?));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        let mut builder = RedisStore::builder(url);
        if let Some(prefix) = &cli.prefix {
            builder = builder.prefix(prefix);
        }
        return Ok(Arc::new(builder.connect().await?));
    }
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    // Opening a path that does not exist would create an empty store: a typo would then list
    // nothing and look like "nothing is stuck".
    if !Path::new(path).is_file() {
        return Err(Failure::Usage(format!(
            "no SQLite store at {path:?}: the file does not exist"
        )));
    }
    Ok(Arc::new(SqliteStore::open(path)?))
}

fn filter(args: FilterArgs) -> Filter {
    Filter {
        tenant: args.tenant,
        tool: args.tool,
        state: args.state,
        older_than: args.older_than,
        key: None,
    }
}

fn table<const N: usize>(header: [&str; N]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY).set_header(header);
    table
}

fn tool_name(tool: Option<&str>) -> String {
    tool.unwrap_or("(not recorded)").to_string()
}

/// How long ago `then` was, to the second.
fn ago(now: SystemTime, then: SystemTime) -> String {
    match now.duration_since(then) {
        Ok(d) => format!(
            "{} ago",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ),
        Err(e) => format!(
            "in {}",
            humantime::format_duration(Duration::from_secs(e.duration().as_secs()))
        ),
    }
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Why a record is unknown, in words an operator acts on.
fn why(entry: &Entry) -> &'static str {
    match (entry.state, entry.reported) {
        (EntryState::Unknown, true) => "its body reported it could not tell whether it acted",
        (EntryState::Unknown, false) => {
            "its worker stopped renewing the lease: it died, or hangs (make sure it is gone first)"
        }
        (EntryState::InProgress, _) => "its body is running",
        (EntryState::Completed, _) => "finished; a retry replays the result",
        (EntryState::Failed, _) => "finished with an error; a retry replays it",
    }
}

fn write_list(out: &mut dyn Write, entries: &[Entry], now: SystemTime) -> std::io::Result<()> {
    let mut table = table(["TENANT", "KEY", "TOOL", "STATE", "RESERVED", "REVISION"]);
    for e in entries {
        table.add_row([
            word(&e.key.tenant),
            word(&e.key.key),
            tool_name(e.tool.as_deref()),
            e.state.to_string(),
            ago(now, e.since),
            word(e.revision.as_str()),
        ]);
    }
    writeln!(out, "{table}")?;
    match entries.len() {
        1 => writeln!(out, "1 record"),
        n => writeln!(out, "{n} records"),
    }
}

fn write_entry(out: &mut dyn Write, e: &Entry, now: SystemTime) -> std::io::Result<()> {
    writeln!(out, "tenant:      {}", word(&e.key.tenant))?;
    writeln!(out, "key:         {}", word(&e.key.key))?;
    writeln!(out, "tool:        {}", tool_name(e.tool.as_deref()))?;
    writeln!(out, "state:       {} ({})", e.state, why(e))?;
    writeln!(
        out,
        "reserved:    {} ({})",
        time(e.since),
        ago(now, e.since)
    )?;
    if let Some(lease) = e.lease_until {
        writeln!(out, "lease until: {} ({})", time(lease), ago(now, lease))?;
    }
    if let Some(at) = e.completed_at {
        writeln!(out, "completed:   {}", time(at))?;
    }
    if let Some(at) = e.expires_at {
        writeln!(out, "expires:     {}", time(at))?;
    }
    if let Some(outcome) = &e.outcome {
        writeln!(out, "outcome:     {}", outcome_json(outcome))?;
    }
    writeln!(out, "revision:    {}", word(e.revision.as_str()))?;
    if e.state == EntryState::Unknown {
        match resolve_line(e) {
            Some(line) => writeln!(
                out,
                "\nCheck the outside system, then:\n  {line} --done --result '<what the tool returned>'\n  {line} --not-done"
            )?,
            None => writeln!(
                out,
                "\nCheck the outside system, then resolve it from a program (`toolkey::admin::Admin`): \
                 its tenant or key holds a NUL byte, which no command line can carry"
            )?,
        }
    }
    Ok(())
}

/// `value` as one POSIX shell word: pasted into a shell, it is that word exactly, whatever it
/// holds (`$(..)`, quotes, backslashes, newlines); a value a shell cannot carry (a NUL byte) is
/// shown in Rust's quoting instead and is never part of a line to paste.
pub fn word(value: &str) -> String {
    match shlex::try_quote(value) {
        Ok(word) => word.into_owned(),
        Err(_) => format!("{value:?}"),
    }
}

/// The `toolkey resolve` line that names exactly the record `e`, without its finding (`--done`
/// or `--not-done`); `None` when its tenant or key cannot be passed on a command line. Every
/// value is one shell word joined to its flag (`--key=<word>`), so a value that starts with `-`
/// is still read as the flag's value.
pub fn resolve_line(e: &Entry) -> Option<String> {
    let flag = |name: &str, value: &str| {
        shlex::try_quote(value)
            .ok()
            .map(|word| format!("--{name}={word}"))
    };
    Some(format!(
        "toolkey resolve {} {} {}",
        flag("tenant", &e.key.tenant)?,
        flag("key", &e.key.key)?,
        flag("revision", e.revision.as_str())?
    ))
}

fn write_resolved(
    out: &mut dyn Write,
    as_json: bool,
    resolution: &Resolution,
    resolved: &Resolved,
    now: SystemTime,
) -> std::io::Result<()> {
    let asked = match resolution {
        Resolution::Done { .. } => "done",
        Resolution::NotDone => "not_done",
    };
    match resolved {
        Resolved::Applied if as_json => {
            writeln!(out, "{}", json!({"resolved": asked}))
        }
        Resolved::Applied => match resolution {
            Resolution::Done { retain, .. } => writeln!(
                out,
                "resolved as done: a retry within {} replays the result given; after that, a \
                 call runs the tool again",
                humantime::format_duration(*retain)
            ),
            Resolution::NotDone => {
                writeln!(
                    out,
                    "resolved as not done: a retry runs the tool once (should its worker be \
                     alive after all and record its outcome first, the retry replays that \
                     instead)"
                )
            }
        },
        Resolved::RetainTooShort { retain } => {
            writeln!(out, "refused: {}", retain_too_short(*retain))
        }
        Resolved::Refused { now: current } if as_json => writeln!(
            out,
            "{}",
            json!({"refused": asked, "record": current.as_deref().map(|e| entry_json(e, now))})
        ),
        Resolved::Refused { now: current } => {
            write!(
                out,
                "refused: the record is not the unknown record that was shown; "
            )?;
            match current.as_deref() {
                None => writeln!(out, "it is gone (resolved, released or expired)"),
                Some(e) if e.state == EntryState::Unknown => writeln!(
                    out,
                    "it is unknown under revision {} now: show it again",
                    word(e.revision.as_str())
                ),
                Some(e) => writeln!(out, "it is {} now ({})", e.state, why(e)),
            }
        }
    }
}

fn outcome_json(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Ok(value) => json!({"result": value}),
        Outcome::Err(e) => e.to_json(),
    }
}

fn entry_json(e: &Entry, now: SystemTime) -> Value {
    let age = now.duration_since(e.since).unwrap_or_default().as_secs();
    json!({
        "tenant": e.key.tenant,
        "key": e.key.key,
        "tool": e.tool,
        "state": e.state.as_str(),
        "reported": e.reported,
        "reserved_at": time(e.since),
        "age_seconds": age,
        "lease_until": e.lease_until.map(time),
        "completed_at": e.completed_at.map(time),
        "expires_at": e.expires_at.map(time),
        "outcome": e.outcome.as_ref().map(outcome_json),
        "revision": e.revision.as_str(),
    })
}
