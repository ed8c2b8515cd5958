//! Integration tests for `tocsin-core`: one binary, one module per concern.

mod apply_model;
mod apply_rules;
mod clock_step;
mod cluster_model;
mod fire_model;
mod recurring;
