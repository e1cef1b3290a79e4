//! The Redis store (feature `redis`).
