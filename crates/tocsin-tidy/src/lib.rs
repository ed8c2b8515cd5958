//! No code: this crate only hosts `tests/tidy.rs`, the repository-wide
//! checks that `cargo test` runs (matklad's "tidy" tests): the dependency
//! direction written in ARCHITECTURE.md, a `//!` doc at the top of every
//! module, and patterns the project bans.
