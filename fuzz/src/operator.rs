//! The operator's surfaces: what `toolkey` prints to paste, its command line, and `Admin`'s
//! operations, fed values a model or a careless hand could put in a key, a tenant, a revision,
//! a `--result` or a `--retain`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolkey::admin::{Admin, Resolved, MIN_RETAIN};
use toolkey::store::{
    Entry, EntryState, Filter, ManualClock, MemoryStore, Outcome, Record, RecordKey, Reservation,
    Reservations, Resolution, SqliteStore, Token,
};
use toolkey::Fingerprint;
use toolkey_cli::Exit;

use crate::gen::Gen;
use crate::harness::Tally;

/// Values worth trying as a tenant, key or revision: what breaks shells, what looks like a flag,
/// lookalikes of one another, and generated text.
fn value(g: &mut Gen) -> String {
    const HOSTILE: &[&str] = &[
        "",
        "acme",
        "acme ",
        "Acme",
        "acme\u{301}",
        "invoice:acme:2026-10",
        "$(touch pwned)",
        "`touch pwned`",
        "'",
        "\"",
        "\\",
        "\n",
        "-rf",
        "--not-done",
        "--key=other",
        "a b",
        "!",
        "~",
        "*",
        "\u{202e}",
        "🦀",
        "\0",
    ];
    match g.range(0, 3) {
        0 => g.pick(HOSTILE).to_string(),
        1 => format!("{}{}", g.pick(HOSTILE), g.pick(HOSTILE)),
        _ => g.text(),
    }
}

/// What a POSIX shell (`sh`) makes of `script`'s `printf '%s\000' ...`: the words it printed.
fn shell_words(script: &str) -> Vec<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("LC_ALL", "C")
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "sh failed on {script:?}: {out:?}");
    let text = String::from_utf8(out.stdout).expect("the words are the UTF-8 they were");
    let mut words: Vec<String> = text.split('\0').map(str::to_owned).collect();
    assert_eq!(
        words.pop().as_deref(),
        Some(""),
        "{script:?} printed {text:?}"
    );
    words
}

/// An unknown record as `show` would print it.
fn entry(key: RecordKey, revision: Token) -> Entry {
    Entry {
        key,
        tool: Some("send_invoice".into()),
        state: EntryState::Unknown,
        reported: true,
        fingerprint: Fingerprint::of(&json!(1)).expect("a fingerprint"),
        since: std::time::SystemTime::UNIX_EPOCH,
        lease_until: None,
        completed_at: None,
        expires_at: None,
        outcome: None,
        revision,
    }
}

/// Every value quoted by [`toolkey_cli::word`] is, to a real POSIX shell, that value and
/// nothing else; the `resolve` line `show` prints, run by that shell, passes exactly the
/// record's tenant, key and revision, each as its flag's value; a value no command line can
/// carry (a NUL byte) gets no line.
pub fn shell_quoting(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    let values: Vec<String> = (0..g.range(1, 4)).map(|_| value(&mut g)).collect();
    let carried: Vec<String> = values
        .iter()
        .filter(|v| !v.contains('\0'))
        .cloned()
        .collect();
    if !carried.is_empty() {
        let words: Vec<String> = carried.iter().map(|v| toolkey_cli::word(v)).collect();
        let script = format!("printf '%s\\000' {}", words.join(" "));
        assert_eq!(shell_words(&script), carried, "{script:?}");
    }
    let (tenant, key, revision) = (value(&mut g), value(&mut g), value(&mut g));
    let shown = entry(
        RecordKey::new(tenant.clone(), key.clone()),
        Token::from_stored(revision.clone()),
    );
    match toolkey_cli::resolve_line(&shown) {
        None => {
            assert!([&tenant, &key, &revision].iter().any(|v| v.contains('\0')));
            tally.code(Some("NO_LINE"));
        }
        Some(line) => {
            let script = format!("toolkey() {{ printf '%s\\000' \"$@\"; }}\n{line} --not-done");
            let argv = shell_words(&script);
            let expected = [
                "resolve".to_string(),
                format!("--tenant={tenant}"),
                format!("--key={key}"),
                format!("--revision={revision}"),
                "--not-done".to_string(),
            ];
            assert_eq!(argv, expected, "{script:?}");
            tally.code(None);
        }
    }
}

/// The command line against a SQLite store: a `resolve` line as `show` prints it, pasted
/// through `sh`, with a generated `--result` and `--retain`, lands on the record it names or is
/// refused, changing nothing; a record of another tenant or key is never touched; a store path
/// that names no file is refused and no file is made.
pub fn cli_resolve(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    let (tenant, key) = (value(&mut g), value(&mut g));
    if tenant.contains('\0') || key.contains('\0') {
        return;
    }
    CLI.with(|cli| {
        let record = RecordKey::new(tenant.clone(), key.clone());
        let revision = cli.unknown(&record);
        let decoys = cli.decoys(&record);
        let line = toolkey_cli::resolve_line(&entry(record.clone(), revision.clone()))
            .expect("a line for values without NUL");
        let script = format!("toolkey() {{ printf '%s\\000' \"$@\"; }}\n{line}");
        let mut args = vec![
            "toolkey".to_string(),
            "--store".into(),
            format!("sqlite:{}", cli.db.display()),
        ];
        args.extend(shell_words(&script));
        let done = g.chance(1, 2);
        let (result, retain) = (result_text(&mut g), retain_text(&mut g));
        if done {
            args.extend(["--done".into(), "--result".into(), result.clone()]);
        } else {
            args.push("--not-done".into());
        }
        if let Some(retain) = &retain {
            args.extend(["--retain".into(), retain.clone()]);
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let exit = cli
            .runtime
            .block_on(toolkey_cli::run(&args, &mut out, &mut err));
        let said = || {
            format!(
                "{args:?}: {}{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            )
        };
        let parsed = serde_json::from_str::<serde_json::Value>(&result).ok();
        let kept = match &retain {
            None => Some(Duration::from_secs(7 * 24 * 60 * 60)),
            Some(text) => humantime::parse_duration(text).ok(),
        };
        let now = cli.get(&record);
        // A `--retain` that is no duration is refused whatever the finding.
        let accepted = kept.is_some_and(|kept| !done || (parsed.is_some() && kept >= MIN_RETAIN));
        if accepted {
            assert_eq!(exit, Exit::Done, "{}", said());
            match (&now, done) {
                (None, false) => {}
                (Some(Record::Completed { outcome, .. }), true) => {
                    assert_eq!(*outcome, Outcome::Ok(parsed.expect("parsed")), "{}", said())
                }
                _ => panic!("{}: the record is now {now:?}", said()),
            }
            tally.code(None);
        } else {
            assert_eq!(exit, Exit::Usage, "{}", said());
            assert!(
                matches!(&now, Some(Record::Stale { token, .. }) if *token == revision),
                "{}: a refused resolution changed the record: {now:?}",
                said()
            );
            tally.code(Some("USAGE"));
        }
        for (decoy, before) in decoys {
            assert_eq!(cli.get(&decoy), before, "{}: touched {decoy:?}", said());
        }
        // A store named by a path that holds no file is refused, and none is made.
        let name: String = value(&mut g)
            .chars()
            .filter(|c| !matches!(c, '/' | '\0'))
            .collect();
        let missing = cli.dir.join(format!("missing-{name}"));
        let url = format!("sqlite:{}", missing.display());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let exit = cli.runtime.block_on(toolkey_cli::run(
            ["toolkey", "--store", &url, "list"],
            &mut out,
            &mut err,
        ));
        assert_eq!(exit, Exit::Usage, "{url:?}");
        assert!(!missing.exists(), "{url:?} made a file");
    });
}

/// A `--result`: JSON most of the time, sometimes text that is not.
fn result_text(g: &mut Gen) -> String {
    if g.chance(3, 4) {
        g.json().to_string()
    } else {
        g.text()
    }
}

/// A `--retain`: none, one of the edges, or generated text.
fn retain_text(g: &mut Gen) -> Option<String> {
    const EDGES: &[&str] = &[
        "0s", "1s", "59m", "59m 59s", "1h", "3600s", "7d", "100y", "-1h",
    ];
    match g.range(0, 3) {
        0 => None,
        1 | 2 => Some(g.pick(EDGES).to_string()),
        _ => Some(g.text()),
    }
}

/// A SQLite store for the command line, with a runtime, kept for a thread's inputs.
struct Cli {
    runtime: tokio::runtime::Runtime,
    /// The fixture's handle on the store, on a clock of its own: moved on past a hundred years
    /// when a record an earlier input resolved as done is in the way.
    store: SqliteStore,
    clock: Arc<ManualClock>,
    /// The store on the system's clock, as the command reads it: what the checks read.
    reader: SqliteStore,
    dir: PathBuf,
    db: PathBuf,
}

thread_local! {
    static CLI: Cli = Cli::new();
}

impl Cli {
    fn new() -> Cli {
        let dir = std::env::temp_dir().join(format!("toolkey-fuzz-{}", Token::generate()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let db = dir.join("store.db");
        let clock = Arc::new(ManualClock::new());
        Cli {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            store: SqliteStore::open(&db)
                .expect("a SQLite store")
                .with_clock(clock.clone()),
            reader: SqliteStore::open(&db).expect("a SQLite store"),
            clock,
            dir,
            db,
        }
    }

    fn get(&self, key: &RecordKey) -> Option<Record> {
        self.runtime
            .block_on(self.reader.get(key))
            .expect("the store reads")
    }

    /// Makes `key` an unknown record (if it is not one already) and returns its revision.
    fn unknown(&self, key: &RecordKey) -> Token {
        self.runtime.block_on(async {
            let token = Token::generate();
            let fp = Fingerprint::of(&json!(1)).expect("a fingerprint");
            let lease = Duration::from_secs(3600);
            match self.store.reserve(key, "tool", &fp, &token, lease).await {
                Ok(Reservation::Reserved { .. }) => {
                    assert!(self.store.mark_unknown(key, &token).await.expect("marked"));
                    token
                }
                Ok(Reservation::Existing(Record::Stale { token, .. })) => token,
                Ok(Reservation::Existing(_)) => {
                    // Resolved as done by an earlier input: let it expire (a retention is at
                    // most a hundred years), and start again.
                    self.clock
                        .advance(Duration::from_secs(101 * 366 * 24 * 60 * 60));
                    let token = Token::generate();
                    let again = self.store.reserve(key, "tool", &fp, &token, lease).await;
                    assert!(
                        matches!(again, Ok(Reservation::Reserved { .. })),
                        "{again:?}"
                    );
                    assert!(self.store.mark_unknown(key, &token).await.expect("marked"));
                    token
                }
                Err(e) => panic!("reserve failed: {e}"),
            }
        })
    }

    /// Records beside `key` that a resolution of it must leave alone, each as it reads now.
    fn decoys(&self, key: &RecordKey) -> Vec<(RecordKey, Option<Record>)> {
        let others = [
            RecordKey::new(key.tenant.clone(), format!("{}x", key.key)),
            RecordKey::new(format!("{}x", key.tenant), key.key.clone()),
            RecordKey::new("", key.key.clone()),
            RecordKey::new(key.tenant.clone(), ""),
        ];
        others
            .into_iter()
            .filter(|other| other != key)
            .map(|other| {
                self.unknown(&other);
                let now = self.get(&other);
                (other, now)
            })
            .collect()
    }
}

/// Admin's operations on a memory store holding lookalike records in every state: a resolution
/// applies exactly when the record named is unknown under the revision named (and a done one
/// keeps its result at least [`MIN_RETAIN`]), changes that record as asked and no other; a
/// refusal changes nothing; listings admit only what their filter admits; nothing panics.
pub fn admin_operations(bytes: &[u8], tally: &Tally) {
    let mut g = Gen::new(bytes, &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = Arc::new(ManualClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let admin = Admin::new(store.clone());
    runtime.block_on(async {
        let fp = Fingerprint::of(&json!(1)).expect("a fingerprint");
        let mut keys: Vec<RecordKey> = Vec::new();
        let mut tokens: Vec<Token> = Vec::new();
        for _ in 0..g.range(1, 5) {
            let key = RecordKey::new(value(&mut g), value(&mut g));
            let token = Token::generate();
            let lease = if g.chance(1, 2) { Duration::from_secs(1) } else { Duration::from_secs(3600) };
            if let Ok(Reservation::Reserved { .. }) =
                store.reserve(&key, "tool", &fp, &token, lease).await
            {
                match g.range(0, 3) {
                    0 => assert!(store.mark_unknown(&key, &token).await.expect("marked")),
                    1 => {
                        let outcome = Outcome::Ok(g.json());
                        let retain = Duration::from_secs(g.range(0, 7200) as u64);
                        assert!(store.complete(&key, &token, &outcome, retain).await.expect("completed"));
                    }
                    _ => {}
                }
                tokens.push(token);
            }
            keys.push(key);
        }
        clock.advance(Duration::from_secs(2));
        for _ in 0..g.range(1, 6) {
            let snapshot = |keys: Vec<RecordKey>| {
                let store = store.clone();
                async move {
                    let mut records = Vec::new();
                    for key in keys {
                        let record = store.get(&key).await.expect("the store reads");
                        records.push((key, record));
                    }
                    records
                }
            };
            match g.range(0, 3) {
                0 | 1 => {
                    let target = if g.chance(7, 8) {
                        g.pick(&keys).clone()
                    } else {
                        RecordKey::new(value(&mut g), value(&mut g))
                    };
                    let seen = if g.chance(7, 8) && !tokens.is_empty() {
                        g.pick(&tokens).clone()
                    } else {
                        Token::from_stored(value(&mut g))
                    };
                    let resolution = if g.chance(1, 2) {
                        // An input run out chooses the first: a retention long enough.
                        let retain = if !g.chance(3, 4) {
                            *g.pick(&[
                                Duration::ZERO,
                                Duration::from_secs(1),
                                MIN_RETAIN - Duration::from_millis(1),
                            ])
                        } else {
                            *g.pick(&[MIN_RETAIN, Duration::from_secs(7 * 24 * 3600), Duration::MAX])
                        };
                        Resolution::Done { outcome: Outcome::Ok(g.json()), retain }
                    } else {
                        Resolution::NotDone
                    };
                    let mut all = keys.clone();
                    all.push(target.clone());
                    let before = snapshot(all.clone()).await;
                    let was = before.iter().find(|(k, _)| *k == target).and_then(|(_, r)| r.clone());
                    let resolved = admin.resolve(&target, &seen, &resolution).await.expect("resolve");
                    let after = snapshot(all).await;
                    let too_short = matches!(&resolution, Resolution::Done { retain, .. } if *retain < MIN_RETAIN);
                    let resolvable = matches!(&was, Some(Record::Stale { token, .. }) if *token == seen);
                    match &resolved {
                        Resolved::RetainTooShort { .. } => {
                            assert!(too_short, "{resolution:?} refused as too short");
                            assert_eq!(before, after, "a refusal changed records");
                            tally.code(Some("RETAIN_TOO_SHORT"));
                        }
                        Resolved::Refused { .. } => {
                            assert!(!too_short && !resolvable, "{target:?} under {seen:?} was refused: {was:?}");
                            assert_eq!(before, after, "a refusal changed records");
                            tally.code(Some("REFUSED"));
                        }
                        Resolved::Applied => {
                            assert!(!too_short && resolvable, "{target:?} under {seen:?} applied to {was:?}");
                            for ((key, b), (_, a)) in before.iter().zip(&after) {
                                if *key != target {
                                    assert_eq!(b, a, "resolving {target:?} changed {key:?}");
                                    continue;
                                }
                                match (&resolution, a) {
                                    (Resolution::NotDone, None) => {}
                                    (Resolution::Done { outcome, .. }, Some(Record::Completed { outcome: o, .. })) => {
                                        assert_eq!(o, outcome)
                                    }
                                    _ => panic!("{target:?} resolved as {resolution:?} reads {a:?}"),
                                }
                            }
                            tally.code(None);
                        }
                    }
                }
                2 => {
                    let filter = Filter {
                        tenant: g.chance(1, 2).then(|| g.pick(&keys).tenant.clone()),
                        key: g.chance(1, 3).then(|| g.pick(&keys).key.clone()),
                        state: g.chance(1, 2).then(|| *g.pick(&EntryState::ALL)),
                        tool: g.chance(1, 4).then(|| "tool".to_string()),
                        older_than: g.chance(1, 4).then(|| Duration::from_secs(1)),
                    };
                    let now = admin.now().await.expect("a clock");
                    let listed = admin.list(&filter, 100).await.expect("a listing");
                    for entry in &listed {
                        assert!(filter.admits(entry, now), "{filter:?} listed {entry:?}");
                    }
                    let counts = admin.counts(&filter).await.expect("counts");
                    assert_eq!(counts.values().sum::<u64>(), listed.len() as u64);
                }
                _ => {
                    let before = snapshot(keys.clone()).await;
                    admin.purge(g.range(1, 3), |_| {}).await.expect("a purge");
                    assert_eq!(before, snapshot(keys.clone()).await, "a purge changed a record still kept");
                }
            }
        }
    });
}
