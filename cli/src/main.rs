//! The `toolkey` command; see the `toolkey_cli` library for what it does.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let exit = toolkey_cli::run(std::env::args_os(), &mut out, &mut err).await;
    std::process::ExitCode::from(exit as u8)
}
