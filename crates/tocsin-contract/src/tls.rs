//! The one way this project builds an HTTP client.

/// An HTTP client builder whose TLS (for `https` webhooks) runs on rustls
/// with the `ring` provider. reqwest is built without a provider of its own
/// (its default, aws-lc-rs, is a CMake build that lengthened a cold build by
/// minutes), so the provider is installed process-wide here, once, before
/// the first client is built; building a client without one panics.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        // Err means another provider is already installed: it is used instead.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}
