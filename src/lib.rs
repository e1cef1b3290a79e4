pub use toolkey_runtime::*;
