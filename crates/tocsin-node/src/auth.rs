//! Bearer tokens on the client ports. A call carries `authorization:
//! Bearer <token>` (gRPC metadata or the HTTP header); the node checks it
//! against the token records in its cached cluster map (stored hashed,
//! replicated by the metadata group, so every node agrees) or against the
//! bootstrap token of its config, then the record's scopes against the
//! namespaces the call touches (`tocsin_core::auth`).
//!
//! Tokens look like `tcn_<id>_<secret>`: the id names the record (and is
//! what `token list` and `token revoke` show), the secret is only ever
//! stored as its SHA-256. The peer port checks none of this: a forwarded
//! request was checked where it entered.

use sha2::Digest as _;
use tocsin_core::auth::Scope;
use tocsin_core::cluster::ClusterMap;

use crate::config::AuthMode;
use crate::config::ConfigError;
use crate::config::NodeConfig;
use crate::error::NodeError;

/// The token prefix.
pub const TOKEN_PREFIX: &str = "tcn_";

/// What this node checks calls against.
pub struct Authority {
    mode: AuthMode,
    bootstrap_sha256: Option<[u8; 32]>,
}

impl Authority {
    pub fn new(config: &NodeConfig) -> Result<Authority, ConfigError> {
        let bootstrap = config.bootstrap_token()?;
        Ok(Authority { mode: config.auth.mode, bootstrap_sha256: bootstrap.map(|t| sha256(&t)) })
    }

    pub fn is_open(&self) -> bool {
        self.mode == AuthMode::Open
    }

    /// Whether `bearer` may make a call that needs `scope` on every one of
    /// `namespaces` (an empty name: all namespaces, which only `*`
    /// grants), or, with no scope, any call of a known token (reading the
    /// shard map, say). Errors say what is missing and nothing about other
    /// namespaces or tokens.
    pub fn check(
        &self,
        map: &ClusterMap,
        bearer: Option<&str>,
        scope: Option<Scope>,
        namespaces: &[&str],
    ) -> Result<(), NodeError> {
        if self.is_open() {
            return Ok(());
        }
        let Some(bearer) = bearer else {
            return Err(NodeError::Unauthenticated(
                "this call needs a bearer token (authorization: Bearer <token>)".into(),
            ));
        };
        if self.bootstrap_sha256.is_some_and(|h| same(&h, &sha256(bearer))) {
            return Ok(());
        }
        let unknown = || NodeError::Unauthenticated("unknown or revoked token".into());
        let (id, secret) = parse(bearer).ok_or_else(unknown)?;
        if !map.is_bootstrapped() {
            // Just started, the cluster map (and its tokens) not loaded yet:
            // a moment, not a verdict on the token.
            return Err(NodeError::unavailable("this node has not loaded the cluster's tokens yet; retry", 200));
        }
        let record = map.tokens.get(id).ok_or_else(unknown)?;
        if !same(&record.secret_sha256, &sha256(secret)) {
            return Err(unknown());
        }
        let Some(scope) = scope else { return Ok(()) };
        if scope == Scope::Admin {
            return if record.allows(Scope::Admin, "") {
                Ok(())
            } else {
                Err(NodeError::PermissionDenied("this token does not grant admin".into()))
            };
        }
        for ns in namespaces {
            if !record.allows(scope, ns) {
                let what = if ns.is_empty() { "every namespace".to_string() } else { format!("namespace {ns:?}") };
                return Err(NodeError::PermissionDenied(format!(
                    "this token does not grant {} on {what}",
                    scope.name()
                )));
            }
        }
        Ok(())
    }
}

/// The token in `authorization: Bearer <token>`, if any.
pub fn bearer_of(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    bearer_in(metadata.get("authorization")?.to_str().ok()?)
}

/// The token in an `Authorization` header's value, if it is a bearer one.
pub fn bearer_in(value: &str) -> Option<&str> {
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?.trim();
    (!token.is_empty()).then_some(token)
}

/// `(id, secret)` of a `tcn_<id>_<secret>` token.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (tocsin_core::auth::valid_token_id(id) && !secret.is_empty()).then_some((id, secret))
}

/// A new token: `(id, the whole token, the SHA-256 of its secret)`.
/// A new webhook signing secret, `whsec_` + 32 random bytes in base64.
pub fn new_webhook_secret() -> String {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(secret))
}

/// What identifies a secret without revealing it: the first 8 bytes of its
/// SHA-256, in hex.
pub fn fingerprint(secret: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(secret)[..8].iter().map(|b| format!("{b:02x}")).collect()
}

pub fn new_token() -> (String, String, [u8; 32]) {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut rng = rand::rng();
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    let hash = sha256(&secret);
    (id, token, hash)
}

pub fn sha256(s: &str) -> [u8; 32] {
    sha2::Sha256::digest(s.as_bytes()).into()
}

/// Compares two digests in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tocsin_core::auth::TokenRecord;

    fn authority(mode: AuthMode, bootstrap: Option<&str>) -> Authority {
        Authority { mode, bootstrap_sha256: bootstrap.map(sha256) }
    }

    #[test]
    fn tokens_are_checked_by_hash_scope_and_namespace() {
        let (id, token, hash) = new_token();
        assert_eq!(parse(&token).map(|(i, _)| i), Some(id.as_str()));
        let mut map = ClusterMap::default();
        let a = authority(AuthMode::Tokens, Some("a-bootstrap-secret-of-32-characters!"));
        let early = a.check(&map, Some(&token), Some(Scope::TimersWrite), &["orders"]).unwrap_err();
        assert_eq!(early.code(), tonic::Code::Unavailable, "no map loaded yet: retry, not refused");
        map.epoch = 1;
        map.tokens.insert(
            id.clone(),
            TokenRecord {
                secret_sha256: hash,
                scopes: vec![Scope::TimersWrite],
                namespaces: vec!["orders".into()],
                label: String::new(),
                created_at_ms: 0,
            },
        );
        let code = |r: Result<(), NodeError>| r.err().map(|e| e.code());
        let write = Some(Scope::TimersWrite);
        assert_eq!(code(a.check(&map, Some(&token), write, &["orders"])), None);
        assert_eq!(code(a.check(&map, Some(&token), None, &[])), None, "any known token reads the map");
        assert_eq!(code(a.check(&map, Some(&token), write, &["billing"])), Some(tonic::Code::PermissionDenied));
        assert_eq!(code(a.check(&map, Some(&token), write, &[""])), Some(tonic::Code::PermissionDenied));
        assert_eq!(code(a.check(&map, Some(&token), Some(Scope::Admin), &[])), Some(tonic::Code::PermissionDenied));
        assert_eq!(code(a.check(&map, None, write, &["orders"])), Some(tonic::Code::Unauthenticated));
        let forged = format!("{TOKEN_PREFIX}{id}_AAAA");
        assert_eq!(code(a.check(&map, Some(&forged), write, &["orders"])), Some(tonic::Code::Unauthenticated));
        let root = "a-bootstrap-secret-of-32-characters!";
        assert_eq!(code(a.check(&map, Some(root), Some(Scope::Admin), &[])), None);
        map.tokens.clear();
        assert_eq!(
            code(a.check(&map, Some(&token), write, &["orders"])),
            Some(tonic::Code::Unauthenticated),
            "revoked"
        );
        assert_eq!(code(authority(AuthMode::Open, None).check(&map, None, write, &["x"])), None);
    }

    #[test]
    fn the_bearer_comes_from_the_authorization_header() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(bearer_of(&md), None);
        md.insert("authorization", "Bearer tcn_ab_cd".parse().unwrap());
        assert_eq!(bearer_of(&md), Some("tcn_ab_cd"));
        md.insert("authorization", "Basic x".parse().unwrap());
        assert_eq!(bearer_of(&md), None);
    }
}
