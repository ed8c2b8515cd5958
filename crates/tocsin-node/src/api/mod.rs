//! The node's APIs: the gRPC `TimerService` ([`timers`]) and
//! `AdminService` ([`admin`]), the HTTP/JSON mirror ([`http`]), and the
//! error mapping they share ([`error`]).

pub mod admin;
pub mod error;
pub mod http;
pub mod timers;
