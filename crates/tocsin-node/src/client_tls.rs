//! Optional TLS on the client ports (gRPC and HTTP).
//!
//! Without it, bearer tokens, payloads and webhook URLs cross the network
//! in clear text between a client and a node, so anyone on the path reads
//! them and can replay a token. With `client_tls` set, both client ports
//! speak TLS only (rustls with ring, the provider of the peer port and the
//! webhooks), and with `client_tls.client_ca_file` a client must also
//! present a certificate that CA signed before a single request is read:
//! tokens, when `auth.mode` is `tokens`, still apply on top.
//!
//! One accept loop per port ([`ClientTls::accept_loop`]) sets TCP_NODELAY
//! (as the plaintext path does: without it a small answer waits out the
//! client's delayed ACK) and runs each handshake in a task of its own under
//! a deadline, so a client that connects and says nothing holds up no one;
//! finished connections go to tonic as a stream and to axum as a
//! [`TlsListener`]. Files are read and checked at start: a missing or
//! unparsable file stops `serve` with the path named.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::config::ClientTlsFiles;

/// How long an accepted connection may take to finish its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// Why client TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    /// A file is missing, unreadable or not PEM of the expected kind.
    #[error("client TLS: reading {path}: {message}")]
    BadFile { path: String, message: String },
    #[error("client TLS: {0}")]
    Setup(String),
}

/// The client ports' TLS: one server configuration per protocol.
pub struct ClientTls {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
    /// Whether clients must present a certificate.
    mutual: bool,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("mutual", &self.mutual).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientTlsError> {
    let bad = |message: String| ClientTlsError::BadFile { path: path.display().to_string(), message };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("holds no certificate".into()));
    }
    Ok(certs)
}

impl ClientTls {
    /// Reads the node's chain and key and, when given, the clients' CA.
    pub fn load(files: &ClientTlsFiles) -> Result<Arc<ClientTls>, ClientTlsError> {
        let setup = |e: rustls::Error| ClientTlsError::Setup(e.to_string());
        let chain = read_certs(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| ClientTlsError::BadFile { path: files.key.display().to_string(), message: e.to_string() })?;
        let builder =
            ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().map_err(setup)?;
        let builder = match &files.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(ca)? {
                    roots.add(cert).map_err(|e| ClientTlsError::BadFile {
                        path: ca.display().to_string(),
                        message: e.to_string(),
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| ClientTlsError::Setup(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        // A key that does not match the certificate is refused here, at
        // start, not at the first handshake.
        let config = builder.with_single_cert(chain, key).map_err(|e| ClientTlsError::BadFile {
            path: files.key.display().to_string(),
            message: format!("does not fit {}: {e}", files.cert.display()),
        })?;
        let with_alpn = |protocols: &[&[u8]]| {
            let mut config = config.clone();
            config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
            Arc::new(config)
        };
        Ok(Arc::new(ClientTls {
            // gRPC clients insist on h2 by ALPN; HTTP clients may speak either.
            grpc: with_alpn(&[b"h2".as_slice()]),
            http: with_alpn(&[b"h2".as_slice(), b"http/1.1".as_slice()]),
            mutual: files.client_ca.is_some(),
        }))
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.mutual
    }

    /// The gRPC port's connections, through TLS.
    pub fn grpc_incoming(
        &self,
        listener: TcpListener,
    ) -> impl tokio_stream::Stream<Item = io::Result<TlsStream<TcpStream>>> + use<> {
        let rx = Self::accept_loop(listener, self.grpc.clone(), "grpc");
        tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |(stream, _)| Ok(stream))
    }

    /// The HTTP port's connections, through TLS, for `axum::serve`.
    pub fn http_listener(&self, listener: TcpListener) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        Ok(TlsListener { rx: Self::accept_loop(listener, self.http.clone(), "http"), local })
    }

    /// Accepts connections and hands over each whose handshake completes
    /// in time; a failed handshake is logged and counted. Ends when the
    /// receiver is dropped (the server stopped).
    fn accept_loop(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        port: &'static str,
    ) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
        let (tx, rx) = mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (tcp, remote) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors, say: wait rather than spin.
                            tracing::warn!(error = %e, port, "client port: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    () = tx.closed() => return,
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, remote)).await;
                        }
                        Ok(Err(e)) => {
                            metrics::counter!("tocsin_client_tls_refused_total", "port" => port).increment(1);
                            tracing::info!(%remote, error = %e, port, "client port: TLS handshake failed; closing");
                        }
                        Err(_) => {
                            metrics::counter!("tocsin_client_tls_refused_total", "port" => port).increment(1);
                        }
                    }
                });
            }
        });
        rx
    }
}

/// The HTTP port's TLS connections as an `axum::serve` listener.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop ended (it ends only once this listener is
            // dropped): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_unparsable_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = crate::peer_tls::new_ca("test", 1).unwrap();
        let node = crate::peer_tls::issue_node(&ca, 1, &["127.0.0.1".into()], 1).unwrap();
        let (cert, key, junk) = (dir.path().join("n.pem"), dir.path().join("n.key"), dir.path().join("junk.pem"));
        std::fs::write(&cert, &node.cert_pem).unwrap();
        std::fs::write(&key, &node.key_pem).unwrap();
        std::fs::write(&junk, "not pem").unwrap();
        let files = |cert: &Path, key: &Path, client_ca: Option<&Path>| ClientTlsFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: client_ca.map(Into::into),
        };
        assert!(!ClientTls::load(&files(&cert, &key, None)).unwrap().mutual());
        assert!(ClientTls::load(&files(&cert, &key, Some(&cert))).unwrap().mutual());
        let missing = dir.path().join("missing.pem");
        for (bad, named) in [
            (files(&missing, &key, None), &missing),
            (files(&junk, &key, None), &junk),
            (files(&cert, &junk, None), &junk),
            (files(&cert, &key, Some(&junk)), &junk),
        ] {
            let err = ClientTls::load(&bad).unwrap_err();
            assert!(matches!(err, ClientTlsError::BadFile { .. }), "{err}");
            assert!(err.to_string().contains(&named.display().to_string()), "{err}");
        }
    }
}
