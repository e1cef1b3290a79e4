//! The PostgreSQL store (feature `postgres`).
