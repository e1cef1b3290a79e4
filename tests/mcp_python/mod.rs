//! The official Python MCP SDK the MCP-over-HTTP tests drive a server with: where it is, and
//! whether it is there.
#![allow(dead_code)]

use std::path::PathBuf;

/// The Python with the MCP SDK, `TOOLKEY_MCP_PYTHON` (default `target/mcp-venv/bin/python`,
/// which `.ci/services.sh` installs); `None` (after saying so) when it is missing outside CI.
/// Under `CI=true` a missing SDK fails the test.
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os("TOOLKEY_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/mcp-venv/bin/python"
            ))
        });
    let probe = std::process::Command::new(&python)
        .args(["-c", "import mcp.client.streamable_http"])
        .output();
    let why = match probe {
        Ok(out) if out.status.success() => return Some(python),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(err) => err.to_string(),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "the Python MCP SDK at {} is missing under CI=true ({why}); install it with .ci/services.sh",
            python.display()
        );
    }
    use std::io::Write;
    // Straight to stderr: the test harness hides what eprintln! says in a passing test.
    let _ = writeln!(
        std::io::stderr(),
        "\n==================== SKIPPED ====================\n\
         the Python MCP SDK at {} is missing: {why}\n\
         This test did NOT run. Install it (bash .ci/services.sh) or set TOOLKEY_MCP_PYTHON.\n\
         =================================================",
        python.display()
    );
    None
}
