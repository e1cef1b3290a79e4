//! What `toolkey show` tells an operator to paste, pasted into a real shell: whatever the key
//! and tenant hold, the line runs `toolkey` alone, with exactly the arguments that name the
//! record shown, and nothing else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use toolkey::store::{RecordKey, Reservation, Reservations, SqliteStore, Token};
use toolkey::Fingerprint;
use toolkey_cli::Exit;

/// Values a model (a key) or a caller (a tenant) could choose, each trying to leave its word.
const HOSTILE: &[&str] = &[
    "$(touch pwned)",
    "`touch pwned`",
    "x'; touch pwned; echo '",
    "x\"; touch pwned; echo \"",
    "both ' and \" quotes",
    "line one\ntouch pwned\n",
    "trailing backslash \\",
    "\\$(touch pwned)",
    "ünïcødé 🦀 invoice:ümlaut",
    "-rf",
    "--key=invoice:other",
    "--not-done",
    "",
    "a b\tc",
    "!! !-1 ^a^b",
    "~root/*.?[a]{b,c}",
    "x;touch pwned #",
    "$HOME ${IFS} $0",
    "\u{202e}reversed",
];

/// A stand-in for `toolkey` first on `PATH`: it writes its arguments, each ended by a NUL byte.
fn stub(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = bin.join("toolkey");
    std::fs::write(
        &path,
        "#!/usr/bin/env bash\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > \"$TOOLKEY_ARGV\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// Pastes `line` into `bash -c` in `dir` with the stub first on `PATH`; the arguments the stub
/// was run with, `None` when it was not run.
fn paste(line: &str, dir: &Path, bin: &Path) -> Option<Vec<String>> {
    let argv = dir.join("argv");
    let _ = std::fs::remove_file(&argv);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let status = Command::new("bash")
        .arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("PATH", path)
        .env("TOOLKEY_ARGV", &argv)
        .status()
        .unwrap();
    assert!(status.success(), "bash failed on {line:?}");
    let bytes = std::fs::read(&argv).ok()?;
    let text = String::from_utf8(bytes).unwrap();
    let mut args: Vec<String> = text.split('\0').map(str::to_owned).collect();
    assert_eq!(args.pop().as_deref(), Some(""), "{text:?}");
    Some(args)
}

async fn toolkey(store: &Path, args: &[&str]) -> (Exit, String, String) {
    let mut line = vec!["toolkey", "--store", store.to_str().unwrap()];
    line.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = toolkey_cli::run(line, &mut out, &mut err).await;
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (exit, text(out), text(err))
}

/// Reserves `key` and leaves it unknown; its revision.
async fn unknown(store: &SqliteStore, key: &RecordKey) -> Token {
    let token = Token::generate();
    let fp = Fingerprint::of(&json!({"customer": "acme"})).unwrap();
    let reserved = store
        .reserve(key, "send_invoice", &fp, &token, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(matches!(reserved, Reservation::Reserved { .. }));
    assert!(store.mark_unknown(key, &token).await.unwrap());
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lines_show_prints_are_safe_to_paste_and_name_the_record_shown() {
    let dir = tempfile::tempdir().unwrap();
    let bin = stub(dir.path());
    let cases = HOSTILE.iter().map(|key| ("acme", *key)).chain(
        HOSTILE
            .iter()
            .map(|tenant| (*tenant, "invoice:acme:2026-10")),
    );
    for (n, (tenant, key)) in cases.enumerate() {
        let path = dir.path().join(format!("{n}.db"));
        let store = SqliteStore::open(&path).unwrap();
        let record = RecordKey::new(tenant, key);
        let revision = unknown(&store, &record).await;
        // Records a careless line could name instead: another key, another tenant.
        for decoy in [
            RecordKey::new(tenant, "invoice:other"),
            RecordKey::new("acme", "invoice:acme:2026-10"),
            RecordKey::new("", key),
        ] {
            if decoy != record {
                unknown(&store, &decoy).await;
            }
        }

        let shown = [format!("--tenant={tenant}"), format!("--key={key}")];
        let (exit, out, err) = toolkey(&path, &["show", &shown[0], &shown[1]]).await;
        assert_eq!(exit, Exit::Done, "{out}{err}");
        // The two commands follow this line; a value's own newline may continue one.
        let (_, pasted) = out
            .split_once("Check the outside system, then:\n  ")
            .unwrap_or_else(|| panic!("no line to paste: {out}"));
        let done_end = "--result '<what the tool returned>'";
        let at = pasted.find(done_end).expect("the done line") + done_end.len();
        let rest = pasted[at..]
            .strip_prefix("\n  ")
            .expect("the not-done line");
        let end = rest.find(" --not-done\n").expect("the not-done line") + " --not-done".len();
        let commands = [pasted[..at].to_string(), rest[..end].to_string()];

        let named = [
            "resolve".to_string(),
            format!("--tenant={tenant}"),
            format!("--key={key}"),
            format!("--revision={revision}"),
        ];
        for command in &commands {
            let argv = paste(command, dir.path(), &bin)
                .unwrap_or_else(|| panic!("pasting {command:?} did not run toolkey"));
            assert!(
                !dir.path().join("pwned").exists(),
                "pasting {command:?} ran another command"
            );
            assert_eq!(argv[..4], named, "pasting {command:?}");
            let finding: Vec<&str> = argv[4..].iter().map(String::as_str).collect();
            assert!(
                finding == ["--not-done"]
                    || finding == ["--done", "--result", "<what the tool returned>"],
                "pasting {command:?} gave {finding:?}"
            );
        }

        // Run as pasted, the not-done line resolves that record and no other.
        let argv = paste(&commands[1], dir.path(), &bin).unwrap();
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (exit, out, err) = toolkey(&path, &args).await;
        assert_eq!(exit, Exit::Done, "{args:?}: {out}{err}");
        assert_eq!(store.get(&record).await.unwrap(), None, "{args:?}");
        for decoy in [
            RecordKey::new(tenant, "invoice:other"),
            RecordKey::new("acme", "invoice:acme:2026-10"),
            RecordKey::new("", key),
        ] {
            if decoy != record {
                assert!(store.get(&decoy).await.unwrap().is_some(), "{args:?}");
            }
        }
    }
}

/// A value that starts with `-` is its flag's value, not another flag: a key as `list` prints
/// it, and a result that is a negative number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_start_with_a_dash_are_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).unwrap();
    let record = RecordKey::new("acme", "-rf");
    let revision = unknown(&store, &record).await;
    let args = [
        "resolve",
        "--tenant",
        "acme",
        "--key",
        "-rf",
        "--revision",
        revision.as_str(),
        "--done",
        "--result",
        "-1",
    ];
    let (exit, out, err) = toolkey(&path, &args).await;
    assert_eq!(exit, Exit::Done, "{out}{err}");
    let record = store.get(&record).await.unwrap();
    assert!(
        matches!(&record, Some(toolkey::store::Record::Completed { outcome: toolkey::store::Outcome::Ok(v), .. }) if *v == json!(-1)),
        "{record:?}"
    );
}
