//! `cargo run --example refund`: a refund API does the work and drops the reply; a retrying
//! client calls it. Which keys make the retry safe?

mod scenario;

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("A refund API that makes the refund, then drops the first reply; the client retries once.\n");
    scenario::run(Duration::from_millis(100), &mut std::io::stdout()).await?;
    Ok(())
}
