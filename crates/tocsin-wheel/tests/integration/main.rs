//! Integration tests for `tocsin-wheel`: one binary, one module per concern.

mod memory;
mod model;
mod rebuild;
