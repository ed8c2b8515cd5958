//! Integration tests for `tocsin-store`, on real RocksDB in temporary
//! directories: one binary, one module per concern.

mod apply;
mod conformance;
mod crash;
mod isolation;
mod memory;
mod metadata;
mod ordering;
mod support;
