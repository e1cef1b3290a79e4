//! The official Python MCP SDK the MCP-over-HTTP tests drive a server with: where it is.

use std::path::PathBuf;

/// The Python with the MCP SDK, `TOOLKEY_MCP_PYTHON` (default `target/mcp-venv/bin/python`,
/// which `.ci/services.sh` installs). A missing SDK fails the test, naming the script that
/// installs it.
pub fn python() -> PathBuf {
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
        Ok(out) if out.status.success() => return python,
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(err) => err.to_string(),
    };
    panic!(
        "the Python MCP SDK at {} is missing ({why}): this test needs it. Run the suite with \
         `bash scripts/test.sh`, which installs it (`bash .ci/services.sh` alone does), or set \
         TOOLKEY_MCP_PYTHON",
        python.display()
    );
}
