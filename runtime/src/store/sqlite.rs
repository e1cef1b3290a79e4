//! The embedded SQLite store (feature `sqlite`, on by default).
