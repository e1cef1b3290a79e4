//! The process tests' child processes: the test binary runs itself, with its
//! `child_process_entry` test doing the child's part when `TOOLKEY_CHILD` is set.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// Starts this test binary as a child running only `child_process_entry`, with `env` set.
pub fn spawn_self(env: &[(&str, &OsStr)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

/// Waits up to 10 s for the child to write `signal`; panics saying `what` did not happen.
pub fn wait_for(signal: &Path, what: &str) {
    for _ in 0..1000 {
        if signal.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what}");
}

/// Waits up to `limit` for the child to exit; past it, kills the child and panics saying `what`
/// did not finish, so a hung child fails its test instead of hanging it.
pub fn finish(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
