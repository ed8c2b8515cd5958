//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>`
//! over `"{webhook-id}.{webhook-timestamp}.{body}"`, keyed by the
//! namespace's secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::Hmac;
use hmac::Mac;
use sha2::Sha256;

/// A `whsec_` secret whose key part is not base64. (Its text is not
/// repeated: error messages end up in logs.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedSecret;

impl std::fmt::Display for MalformedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a secret starting with whsec_ must continue in standard base64")
    }
}

impl std::error::Error for MalformedSecret {}

/// The key bytes of a configured secret: `whsec_<base64>` is decoded (the
/// Standard Webhooks convention), anything else is used as is. A `whsec_`
/// secret that does not decode is an error, never silently used as text:
/// the receiver would decode it and every signature would fail.
pub fn secret_bytes(secret: &str) -> Result<Vec<u8>, MalformedSecret> {
    match secret.strip_prefix("whsec_") {
        Some(b64) => STANDARD.decode(b64).map_err(|_| MalformedSecret),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

/// The HMAC over `"{id}.{timestamp_s}.{body}"`, ready to finalize or verify.
fn mac(secret: &[u8], id: &str, timestamp_s: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `webhook-signature` header value.
pub fn sign(secret: &[u8], id: &str, timestamp_s: u64, body: &[u8]) -> String {
    format!("v1,{}", STANDARD.encode(mac(secret, id, timestamp_s, body).finalize().into_bytes()))
}

/// Checks a `webhook-signature` header (which may list several
/// space-separated signatures, for key rotation) in constant time.
pub fn verify(secret: &[u8], id: &str, timestamp_s: u64, body: &[u8], header: &str) -> bool {
    header.split_whitespace().filter_map(|s| s.strip_prefix("v1,")).any(|sig| {
        let Ok(sig) = STANDARD.decode(sig) else { return false };
        // `verify_slice` compares in constant time.
        mac(secret, id, timestamp_s, body).verify_slice(&sig).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_test_vector() {
        // From the Standard Webhooks specification's reference libraries.
        let secret = secret_bytes("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let ts = 1614265330;
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(sign(&secret, id, ts, body), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(&secret, id, ts, body, "v1,bogus v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
        assert!(!verify(&secret, id, ts + 1, body, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
    }

    #[test]
    fn a_malformed_whsec_secret_is_an_error() {
        assert_eq!(secret_bytes("whsec_not base64!"), Err(MalformedSecret));
        assert_eq!(secret_bytes("a plain secret of enough bytes").unwrap(), b"a plain secret of enough bytes");
    }
}
