//! The API layer: the gRPC `TimerService` ([`timers`]) and `AdminService`
//! ([`admin`]), the HTTP/JSON mirror ([`http`]), and the peer API
//! `ReplicaControl` ([`peer`]), the web console ([`console`]); each request is
//! parsed into a validated value once ([`parse`]). The HTTP routes are
//! tables, with the one JSON error shape and the OpenAPI pieces the HTTP
//! modules share ([`rest`]). Errors are the node's
//! (`crate::error`); their code names and HTTP statuses are the contract's
//! (`tocsin_contract::codes`).

pub mod admin;
pub mod console;
pub mod http;
pub mod parse;
pub mod peer;
pub mod request;
pub mod rest;
pub mod timers;
