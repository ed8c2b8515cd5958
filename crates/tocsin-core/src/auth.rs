//! Who may do what: bearer-token grants (scopes on namespaces) as the
//! cluster map stores them, and the one rule that decides a call. Pure: the
//! node hashes the presented secret and looks its record up; this module
//! only says whether the record allows the call.
//!
//! A token is stored as the SHA-256 of its secret, never the secret, so a
//! copy of the metadata (a snapshot, a backup) grants nothing.

use serde::Deserialize;
use serde::Serialize;

/// Most tokens the cluster map holds.
pub const MAX_TOKENS: usize = 10_000;
/// Most namespace patterns one token names.
pub const MAX_PATTERNS: usize = 64;
/// Longest label, and longest namespace pattern, in bytes.
pub const MAX_LABEL_BYTES: usize = 200;
/// Longest token id, in bytes.
pub const MAX_TOKEN_ID_BYTES: usize = 32;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Create, cancel and reschedule timers.
    TimersWrite,
    /// Get and list timers, and a namespace's horizon.
    TimersRead,
    /// Reserve, ack and nack pull deliveries.
    Pull,
    /// `AdminService` operations and token management, on the whole
    /// cluster (namespaces do not apply).
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::TimersWrite, Scope::TimersRead, Scope::Pull, Scope::Admin];

    /// The wire name: `timers:write`, `timers:read`, `pull`, `admin`.
    pub fn name(self) -> &'static str {
        match self {
            Scope::TimersWrite => "timers:write",
            Scope::TimersRead => "timers:read",
            Scope::Pull => "pull",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.name() == name.trim())
    }
}

/// One token, as the cluster map stores it (keyed by its id).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// SHA-256 of the token's secret part.
    pub secret_sha256: [u8; 32],
    /// Sorted, distinct.
    pub scopes: Vec<Scope>,
    /// Namespace patterns: a name, a prefix ending in `*`, or `*` (all).
    pub namespaces: Vec<String>,
    /// What the operator called it.
    pub label: String,
    /// The metadata leader's clock when it was created.
    pub created_at_ms: u64,
}

impl TokenRecord {
    /// Whether this token may do `scope` on `namespace`. `Admin` is
    /// cluster-wide; the other scopes need a pattern matching `namespace`.
    pub fn allows(&self, scope: Scope, namespace: &str) -> bool {
        if !self.scopes.contains(&scope) {
            return false;
        }
        scope == Scope::Admin || self.namespaces.iter().any(|p| namespace_matches(p, namespace))
    }

    /// The record's own rules; `Err` names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        if self.scopes.is_empty() {
            return Err("a token needs at least one scope".into());
        }
        if self.scopes.windows(2).any(|w| w[0] >= w[1]) {
            return Err("scopes must be sorted and distinct".into());
        }
        let namespaced = self.scopes.iter().any(|s| *s != Scope::Admin);
        if namespaced && self.namespaces.is_empty() {
            return Err("timers:write, timers:read and pull need at least one namespace (or *)".into());
        }
        if self.namespaces.len() > MAX_PATTERNS {
            return Err(format!("{} namespace patterns, more than {MAX_PATTERNS}", self.namespaces.len()));
        }
        for p in &self.namespaces {
            let stem = p.strip_suffix('*').unwrap_or(p);
            if p.is_empty() || p.len() > MAX_LABEL_BYTES || stem.contains('*') {
                return Err(format!("namespace pattern {p:?}: a name, a prefix ending in *, or *"));
            }
        }
        if self.label.len() > MAX_LABEL_BYTES {
            return Err(format!("the label is longer than {MAX_LABEL_BYTES} bytes"));
        }
        Ok(())
    }
}

/// Whether `pattern` (a name, `prefix*` or `*`) matches `namespace`.
pub fn namespace_matches(pattern: &str, namespace: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => namespace.starts_with(prefix),
        None => pattern == namespace,
    }
}

/// Whether `id` may name a token: 1 to 32 ASCII letters, digits or `-`.
pub fn valid_token_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_TOKEN_ID_BYTES && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(scopes: &[Scope], namespaces: &[&str]) -> TokenRecord {
        TokenRecord {
            secret_sha256: [0; 32],
            scopes: scopes.to_vec(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            label: String::new(),
            created_at_ms: 0,
        }
    }

    #[test]
    fn scopes_apply_to_the_namespaces_named_and_admin_to_none() {
        let t = record(&[Scope::TimersWrite, Scope::TimersRead], &["orders", "team-*"]);
        assert!(t.check().is_ok());
        assert!(t.allows(Scope::TimersWrite, "orders"));
        assert!(t.allows(Scope::TimersRead, "team-a"));
        assert!(!t.allows(Scope::TimersWrite, "orders2"), "a name is not a prefix");
        assert!(!t.allows(Scope::TimersWrite, "billing"));
        assert!(!t.allows(Scope::Pull, "orders"), "a scope not granted");
        assert!(!t.allows(Scope::Admin, "orders"));
        let admin = record(&[Scope::Admin], &[]);
        assert!(admin.check().is_ok());
        assert!(admin.allows(Scope::Admin, ""));
        assert!(!admin.allows(Scope::TimersRead, "orders"), "admin is not a timers scope");
        assert!(record(&[Scope::Pull], &["*"]).allows(Scope::Pull, "anything"));
    }

    #[test]
    fn malformed_records_are_refused() {
        assert!(record(&[], &["a"]).check().is_err());
        assert!(record(&[Scope::TimersRead, Scope::TimersWrite], &["a"]).check().is_err(), "unsorted");
        assert!(record(&[Scope::Pull], &[]).check().is_err(), "no namespace");
        assert!(record(&[Scope::Pull], &["a*b"]).check().is_err());
        assert!(record(&[Scope::Pull], &["**"]).check().is_err());
        assert!(record(&[Scope::Pull], &[""]).check().is_err());
        assert_eq!(Scope::parse(" timers:write"), Some(Scope::TimersWrite));
        assert_eq!(Scope::parse("root"), None);
        assert!(valid_token_id("a1-B2") && !valid_token_id("") && !valid_token_id("a_b"));
    }
}
