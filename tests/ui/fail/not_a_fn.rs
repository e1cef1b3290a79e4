use toolkey::tool;

#[tool(read_only)]
struct Lookup {
    customer: String,
}

fn main() {}
