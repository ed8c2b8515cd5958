//! Mutual TLS between nodes on the peer port.
//!
//! Every node holds a certificate signed by the cluster's CA whose subject
//! alternative names include `node-<id>.peer.tocsin` (what `tocsin certs
//! issue` writes). Both ends of every peer connection, Raft links and
//! gRPC alike, present their certificate and check the other's against the
//! CA (rustls with ring, the provider the webhooks use):
//!
//! - a node dialing a known peer (a Raft link to node 3) asks for the name
//!   `node-3.peer.tocsin`, so another node's certificate does not pass;
//!   one dialing an address (a forwarded request, a control call) accepts
//!   any node of the cluster;
//! - a node accepting a connection learns which node ids its peer's
//!   certificate names ([`PeerConn`]); a Raft message or snapshot whose
//!   `from_node` is not one of them is refused, so a node cannot speak for
//!   another, and a host without a certificate from the CA cannot speak at
//!   all.
//!
//! One port carries two protocols; with TLS, ALPN tells them apart (a Raft
//! link offers [`LINK_ALPN`], gRPC `h2`) where plaintext uses the first
//! byte. A certificate's names are read only after rustls has verified its
//! chain, validity and key usage.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::task::Poll;

use rustls::ClientConfig;
use rustls::ServerConfig;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::client::danger::ServerCertVerified;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::ServerName;
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;
use tokio::net::TcpStream;

use crate::config::PeerTlsFiles;

/// The ALPN protocol of a Raft link (`shard/link.rs`).
pub const LINK_ALPN: &[u8] = b"tocsin-link/1";
/// gRPC's.
pub const H2_ALPN: &[u8] = b"h2";
/// Every node name ends so: `node-<id>.peer.tocsin`.
const NAME_SUFFIX: &str = ".peer.tocsin";
/// The server name asked for when the node behind an address is not known
/// in advance: any node of the cluster passes.
const ANY_NODE: &str = "peer.tocsin";

/// The certificate name that binds node `id`.
pub fn node_name(id: u64) -> String {
    format!("node-{id}{NAME_SUFFIX}")
}

/// The node id a certificate name binds, if it is a node name.
pub fn parse_node_name(name: &str) -> Option<u64> {
    let id: u64 = name.strip_prefix("node-")?.strip_suffix(NAME_SUFFIX)?.parse().ok()?;
    (id > 0).then_some(id)
}

/// The node ids a certificate's DNS names bind (none if it does not parse).
/// Only for certificates rustls has verified.
pub fn node_ids(cert: &CertificateDer<'_>) -> Vec<u64> {
    match webpki::EndEntityCert::try_from(cert) {
        Ok(cert) => cert.valid_dns_names().filter_map(parse_node_name).collect(),
        Err(_) => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    #[error("peer TLS: reading {path}: {message}")]
    Read { path: String, message: String },
    #[error("peer TLS: {path} holds no certificate")]
    NoCertificate { path: String },
    #[error(
        "peer TLS: {path} does not name this node (node {node} needs the name {name}; it names {names:?}): issue one with `tocsin certs issue --node {node}`"
    )]
    NotThisNode { path: String, node: u64, name: String, names: Vec<u64> },
    #[error("peer TLS: this node's certificate {path} does not verify against {ca}: {reason}")]
    NotFromCa { path: String, ca: String, reason: String },
    #[error("peer TLS: {0}")]
    Setup(String),
}

/// This node's peer TLS: what it presents and what it accepts.
pub struct PeerTls {
    node_id: u64,
    server: Arc<ServerConfig>,
    link: Arc<ClientConfig>,
    grpc: Arc<ClientConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PeerTlsError> {
    let shown = path.display().to_string();
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| PeerTlsError::Read { path: shown.clone(), message: e.to_string() })?
        .collect::<Result<_, _>>()
        .map_err(|e| PeerTlsError::Read { path: shown.clone(), message: e.to_string() })?;
    if certs.is_empty() {
        return Err(PeerTlsError::NoCertificate { path: shown });
    }
    Ok(certs)
}

impl PeerTls {
    /// Loads the CA, this node's chain and key, and checks that the chain
    /// verifies against the CA and names `node_id`: a node that would be
    /// refused by every peer fails at start instead.
    pub fn load(files: &PeerTlsFiles, node_id: u64) -> Result<Arc<PeerTls>, PeerTlsError> {
        let setup = |e: rustls::Error| PeerTlsError::Setup(e.to_string());
        let ca = read_certs(&files.ca)?;
        let chain = read_certs(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| PeerTlsError::Read { path: files.key.display().to_string(), message: e.to_string() })?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in ca {
            roots.add(cert).map_err(setup)?;
        }
        let roots = Arc::new(roots);
        let ids = node_ids(&chain[0]);
        if !ids.contains(&node_id) {
            return Err(PeerTlsError::NotThisNode {
                path: files.cert.display().to_string(),
                node: node_id,
                name: node_name(node_id),
                names: ids,
            });
        }
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| PeerTlsError::Setup(e.to_string()))?;
        let own_name = ServerName::try_from(node_name(node_id)).map_err(|e| PeerTlsError::Setup(e.to_string()))?;
        server_verifier.verify_server_cert(&chain[0], &chain[1..], &own_name, &[], UnixTime::now()).map_err(|e| {
            PeerTlsError::NotFromCa {
                path: files.cert.display().to_string(),
                ca: files.ca.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| PeerTlsError::Setup(e.to_string()))?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(setup)?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(setup)?;
        server.alpn_protocols = vec![LINK_ALPN.to_vec(), H2_ALPN.to_vec()];
        let verifier = Arc::new(NodeVerifier { inner: server_verifier });
        let client = |alpn: &[u8]| -> Result<Arc<ClientConfig>, PeerTlsError> {
            let mut config = ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(setup)?
                .dangerous()
                .with_custom_certificate_verifier(verifier.clone())
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(setup)?;
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(config))
        };
        Ok(Arc::new(PeerTls { node_id, server: Arc::new(server), link: client(LINK_ALPN)?, grpc: client(H2_ALPN)? }))
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The server half, for the peer port's accept loop.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// Opens TLS for a Raft link to node `target` on `stream`: the peer
    /// must present `target`'s certificate.
    pub async fn connect_link(
        &self,
        stream: TcpStream,
        target: u64,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(node_name(target)).map_err(io::Error::other)?;
        tokio_rustls::TlsConnector::from(self.link.clone()).connect(name, stream).await
    }

    /// A lazily connecting gRPC channel to a peer port through TLS.
    pub fn channel(self: &Arc<Self>, endpoint: tonic::transport::Endpoint) -> tonic::transport::Channel {
        let tls = self.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: http::Uri| {
            let config = tls.grpc.clone();
            async move {
                let authority = uri.authority().map(|a| a.as_str().to_string()).unwrap_or_default();
                let tcp = TcpStream::connect(authority).await?;
                let _ = tcp.set_nodelay(true);
                let name = ServerName::try_from(ANY_NODE).map_err(io::Error::other)?;
                let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
    }
}

/// A gRPC channel to a peer port: through TLS when `tls` is on.
pub fn peer_channel(tls: Option<&Arc<PeerTls>>, endpoint: tonic::transport::Endpoint) -> tonic::transport::Channel {
    match tls {
        Some(tls) => tls.channel(endpoint),
        None => endpoint.connect_lazy(),
    }
}

/// Checks a peer's certificate with webpki against the cluster CA, for the
/// node name asked for, or for whichever node name the certificate carries
/// when any node will do ([`ANY_NODE`]).
#[derive(Debug)]
struct NodeVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let wanted = match server_name {
            ServerName::DnsName(name) => parse_node_name(name.as_ref()),
            _ => None,
        };
        let id = match wanted {
            Some(id) => id,
            None => *node_ids(end_entity)
                .first()
                .ok_or(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))?,
        };
        let name = ServerName::try_from(node_name(id)).map_err(|e| rustls::Error::General(e.to_string()))?;
        self.inner.verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Who is on the other end of an accepted peer connection: put in every
/// gRPC request's extensions (tonic's `Connected`), and checked by the
/// Raft link server for each message.
#[derive(Clone, Debug)]
pub struct PeerConn {
    pub remote: Option<SocketAddr>,
    /// The node ids its verified certificate names; None on a plaintext
    /// port (no TLS configured), where nothing is checked.
    pub node_ids: Option<Arc<[u64]>>,
}

impl PeerConn {
    /// Whether a message claiming to come from `from_node` may be taken.
    pub fn speaks_for(&self, from_node: u64) -> bool {
        self.node_ids.as_ref().is_none_or(|ids| ids.contains(&from_node))
    }

    /// The identity of a verified TLS connection.
    pub fn of_tls<IO>(remote: Option<SocketAddr>, stream: &tokio_rustls::server::TlsStream<IO>) -> PeerConn {
        let ids: Vec<u64> =
            stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(node_ids).unwrap_or_default();
        PeerConn { remote, node_ids: Some(ids.into()) }
    }
}

/// An accepted peer connection handed to the gRPC server.
pub enum PeerIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, PeerConn),
}

impl tonic::transport::server::Connected for PeerIo {
    type ConnectInfo = PeerConn;

    fn connect_info(&self) -> PeerConn {
        match self {
            PeerIo::Plain(tcp) => PeerConn { remote: tcp.peer_addr().ok(), node_ids: None },
            PeerIo::Tls(_, conn) => conn.clone(),
        }
    }
}

impl AsyncRead for PeerIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerIo::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerIo::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            PeerIo::Tls(s, _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PeerIo::Plain(s) => s.is_write_vectored(),
            PeerIo::Tls(s, _) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerIo::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerIo::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A certificate and its private key, both PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("key_pem", &"<redacted>").finish_non_exhaustive()
    }
}

fn rcgen_error(e: rcgen::Error) -> PeerTlsError {
    PeerTlsError::Setup(e.to_string())
}

/// A new cluster CA (`tocsin certs init`): an ECDSA P-256 key and a
/// self-signed certificate, valid for `days`, that may sign node
/// certificates only (path length 0).
pub fn new_ca(common_name: &str, days: u32) -> Result<Issued, PeerTlsError> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    set_validity(&mut params, days);
    let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
    let cert = params.self_signed(&key).map_err(rcgen_error)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// A certificate for node `node_id` signed by `ca` (`tocsin certs issue`):
/// its names are `node-<id>.peer.tocsin` (the identity peers check) and
/// `hosts` (DNS names or IP addresses, for clients that dial the node by
/// name); it serves as both TLS server and client, since a node is both.
pub fn issue_node(ca: &Issued, node_id: u64, hosts: &[String], days: u32) -> Result<Issued, PeerTlsError> {
    if node_id == 0 {
        return Err(PeerTlsError::Setup("node ids start at 1".into()));
    }
    let mut names = vec![node_name(node_id)];
    names.extend(hosts.iter().cloned());
    let usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    issue(ca, &node_name(node_id), names, usages, days)
}

/// A client certificate signed by `ca` (`tocsin certs client`), for a
/// node's client port with `client_tls.client_ca_file`: `name` is its
/// common name only. It carries no DNS name, so it names no node and
/// the peer port refuses it even when the same CA signed the nodes'
/// certificates; and it may only authenticate a client.
pub fn issue_client(ca: &Issued, name: &str, days: u32) -> Result<Issued, PeerTlsError> {
    if name.trim().is_empty() || name.ends_with(NAME_SUFFIX) || name == ANY_NODE {
        return Err(PeerTlsError::Setup(format!("{name:?} is empty or a node name; give a client's name")));
    }
    issue(ca, name, Vec::new(), vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth], days)
}

/// A certificate signed by `ca` with a fresh ECDSA P-256 key.
fn issue(
    ca: &Issued,
    common_name: &str,
    names: Vec<String>,
    usages: Vec<rcgen::ExtendedKeyUsagePurpose>,
    days: u32,
) -> Result<Issued, PeerTlsError> {
    let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem).map_err(rcgen_error)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(rcgen_error)?;
    let mut params = rcgen::CertificateParams::new(names).map_err(rcgen_error)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, days);
    let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
    let cert = params.signed_by(&key, &issuer).map_err(rcgen_error)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// From a day ago (clocks of a cluster differ) for `days`.
fn set_validity(params: &mut rcgen::CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(i64::from(days.max(1)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_round_trip_and_nothing_else_parses() {
        assert_eq!(parse_node_name(&node_name(7)), Some(7));
        for other in ["node-0.peer.tocsin", "node-x.peer.tocsin", "node-7.peer.tocsin.evil", "peer.tocsin", "node-7"] {
            assert_eq!(parse_node_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_client_certificate_names_no_node() {
        let ca = new_ca("test", 1).unwrap();
        let client = issue_client(&ca, "billing", 1).unwrap();
        let der = CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).unwrap();
        assert!(node_ids(&der).is_empty());
        for bad in ["", " ", "node-1.peer.tocsin", "peer.tocsin"] {
            assert!(issue_client(&ca, bad, 1).is_err(), "{bad:?}");
        }
    }
}
