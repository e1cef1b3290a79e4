use std::rc::Rc;
use toolkey::{tool, ToolError};

/// Holds an `Rc` across an `.await`: its future cannot move between threads.
#[tool(read_only)]
async fn count(name: String) -> Result<usize, ToolError> {
    let shared = Rc::new(name);
    std::future::ready(()).await;
    Ok(shared.len())
}

fn main() {}
