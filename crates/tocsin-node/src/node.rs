//! The composition root: builds a node's parts (the store, the shared
//! state, one Raft group per hosted shard, the fire loops, delivery, the
//! gRPC and HTTP servers), starts them in order and stops them. Nothing
//! else in the crate imports this module.
//!
//! Start-up order matters: listeners are bound first (so an `:0` port is
//! known before it is written into Raft membership), then every hosted
//! group (shards and, where hosted, the metadata group) is opened from the
//! store (restart recovery: openraft replays nothing already applied, the
//! state machine is durable), then the initial memberships are written if
//! the cluster is new, and finally the servers start.

use axum::serve::ListenerExt as _;
use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tocsin_core::ShardId;
use tocsin_proto::v1 as pb;
use tocsin_store::NodeAddr;
use tocsin_store::Store;
use tocsin_store::StoreConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::api::admin::AdminApi;
use crate::api::timers::TimerApi;
use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::control::map::MapCache;
use crate::control::state::NodeState;
use crate::control::state::ShardTable;
use crate::error::StartError;
use crate::forward::Forwarder;
use crate::runtime::SideRuntime;
use crate::shard::delivery::Dispatcher;
use crate::shard::delivery::pull::PullHub;
use crate::shard::delivery::webhook::WebhookSender;
use crate::shard::raft::Groups;
use crate::shard::raft::Router;
use crate::shard::raft::TransportService;
use crate::shard::raft::openraft_config;

/// Replica moves a node runs at once as a shard leader: each streams a
/// snapshot and catches a learner up, and the fire loops share the cores.
const MOVES_AT_ONCE: usize = 1;

/// A running node.
pub struct Node {
    pub state: Arc<NodeState>,
    /// The client gRPC API.
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The peer API (other nodes only).
    pub peer_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    supervisors: Vec<JoinHandle<()>>,
    /// Dropped last: every group's core runs on it.
    raft_runtime: SideRuntime,
    /// Dropped before the Raft runtime: proposers, fire loops, deliveries.
    fire_runtime: SideRuntime,
}

impl Node {
    /// Opens the store, starts every hosted shard's group and serves. The
    /// order matters: listeners first (so a `:0` port is known before it is
    /// written into Raft membership), then the shared state, every hosted
    /// group reopened from the store, the servers, the first memberships of
    /// a new cluster, and last the control loops.
    pub async fn start(config: NodeConfig, metrics: Option<PrometheusHandle>) -> Result<Node, StartError> {
        config.validate()?;
        // Read before anything is bound or opened: a bad file stops the
        // start with its path named.
        let client_tls = match config.client_tls_files()? {
            Some(files) => Some(crate::client_tls::ClientTls::load(&files)?),
            None => None,
        };
        let listeners = Listeners::bind(config).await?;
        let config = listeners.config.clone();
        let store = Store::open(&StoreConfig::new(&config.data_dir))
            .map_err(|source| StartError::Store { path: config.data_dir.display().to_string(), source })?;
        let placement = Placement::of(&config, &store)?;
        let raft_runtime = SideRuntime::start_raft(config.raft.thread_nice).map_err(StartError::Runtime)?;
        let fire_runtime = SideRuntime::start_fire().map_err(StartError::Runtime)?;
        let state = shared_state(&config, store.clone(), metrics, &placement, &raft_runtime, &fire_runtime)?;
        if placement.host_meta {
            state.open_meta().await?;
            state.local_map().await;
        }
        for shard in &placement.hosted {
            state.open_shard(*shard).await?;
        }
        state.persist_hosted(placement.bootstrapped).await?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let Listeners { grpc, http, peer, grpc_addr, http_addr, peer_addr, .. } = listeners;
        let servers = vec![
            tokio::spawn(serve_client_grpc(state.clone(), grpc, client_tls.clone(), shutdown_rx.clone())),
            // Raft's links are accepted and served on the Raft runtime; every
            // other peer connection (gRPC) is served here, on the work runtime.
            tokio::spawn(serve_peer_grpc(
                state.clone(),
                peer,
                store.path().join("spool"),
                shutdown_rx.clone(),
                raft_runtime.handle().clone(),
            )),
            tokio::spawn(serve_http(state.clone(), http, client_tls.clone(), shutdown_rx)),
        ];
        if !placement.bootstrapped {
            placement.bootstrap(&state).await?;
        }
        let supervisors = vec![
            tokio::spawn(crate::control::balance::run(state.clone())),
            tokio::spawn(crate::control::reconcile::run(state.clone())),
            tokio::spawn(crate::control::balance::watch_health(state.clone())),
            raft_runtime.handle().spawn(crate::shard::raft_timer::run_liveness(
                state.quiet.clone(),
                state.router.clone(),
                Duration::from_millis(config.raft.heartbeat_ms),
            )),
        ];
        tracing::info!(node_id = config.node_id, %grpc_addr, %http_addr, %peer_addr, shards = config.num_shards, hosted = placement.hosted.len(), metadata = placement.host_meta, data = %config.data_dir.display(), "node started");
        if state.peer_tls.is_some() {
            tracing::info!(name = %crate::peer_tls::node_name(config.node_id), "peer TLS on: peers must present a certificate from the cluster CA");
        }
        match &client_tls {
            Some(tls) if tls.mutual() => {
                tracing::info!("client TLS on: the client ports speak TLS only and require a client certificate")
            }
            Some(_) => tracing::info!("client TLS on: the client ports speak TLS only"),
            None => {}
        }
        Ok(Node { state, grpc_addr, http_addr, peer_addr, shutdown, servers, supervisors, raft_runtime, fire_runtime })
    }

    /// Takes what a running node can change without a restart from a
    /// freshly loaded config: the webhook signing secrets (rotation).
    /// Returns how many namespaces sign. Everything else in `config` is
    /// ignored until the next start.
    pub fn reload(&self, config: &NodeConfig) -> Result<usize, crate::config::ConfigError> {
        config.validate()?;
        let keys = config.signing_keys()?;
        let n = keys.len();
        self.state.dispatcher.webhook.set_secrets(keys);
        Ok(n)
    }

    /// Waits until every hosted shard has a leader, or the timeout passes.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let meta_led = self.state.meta().is_none_or(|m| m.raft.metrics().borrow_watched().current_leader.is_some());
            if meta_led
                && self.state.shards.all().iter().all(|c| c.raft.metrics().borrow_watched().current_leader.is_some())
            {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Hands over its leaderships, stops serving, stops every group, and
    /// closes the store.
    pub async fn shutdown(self) {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        crate::control::balance::hand_over_all(&self.state, Duration::from_secs(3)).await;
        let _ = self.shutdown.send(true);
        for s in self.supervisors {
            s.abort();
        }
        for (group, raft) in self.state.groups.all() {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group, error = %e, "raft shutdown");
            }
        }
        for s in self.servers {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
        // Stop compactions and flushes before the process exits: RocksDB's
        // background threads must not outlive its static state. Everything
        // acknowledged is already in the synced WAL.
        let store = self.state.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.db().cancel_all_background_work(true)).await;
        // Last: every group's core ran on them, and all are shut down now.
        self.fire_runtime.stop().await;
        self.raft_runtime.stop().await;
    }
}

/// The bound listeners, and the config with its advertised addresses
/// resolved.
struct Listeners {
    config: Arc<NodeConfig>,
    grpc: TcpListener,
    http: TcpListener,
    peer: TcpListener,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    peer_addr: SocketAddr,
}

impl Listeners {
    async fn bind(mut config: NodeConfig) -> Result<Listeners, StartError> {
        let bind = |addr: &String| {
            let addr = addr.clone();
            async move {
                let listener =
                    TcpListener::bind(&addr).await.map_err(|source| StartError::Bind { addr: addr.clone(), source })?;
                let local = listener.local_addr().map_err(|source| StartError::Bind { addr, source })?;
                Ok::<_, StartError>((listener, local))
            }
        };
        let (grpc, grpc_addr) = bind(&config.grpc_listen).await?;
        let (http, http_addr) = bind(&config.http_listen).await?;
        let (peer, peer_addr) = bind(&config.peer_listen()).await?;
        // Without an explicit advertise address a node advertises its own
        // `initial_cluster` entry, or else the address it actually bound
        // (which resolves a `:0` listen port).
        if config.grpc_advertise.is_none() {
            let own = config.grpc_advertise();
            config.grpc_advertise = Some(if own == config.grpc_listen { grpc_addr.to_string() } else { own });
        }
        if config.http_advertise.is_none() {
            let own = config.http_advertise();
            config.http_advertise = Some(if own == config.http_listen { http_addr.to_string() } else { own });
        }
        if config.peer_advertise.is_none() {
            let own = config.peer_advertise();
            config.peer_advertise = Some(if own == config.peer_listen() { peer_addr.to_string() } else { own });
        }
        Ok(Listeners { config: Arc::new(config), grpc, http, peer, grpc_addr, http_addr, peer_addr })
    }
}

/// Which groups this node hosts, and whether the cluster still needs its
/// first memberships written.
struct Placement {
    /// Initial members.
    members: Vec<crate::config::Member>,
    ring: tocsin_core::routing::Ring,
    replication: usize,
    meta_voters: Vec<u64>,
    hosted: Vec<ShardId>,
    host_meta: bool,
    bootstrapped: bool,
}

impl Placement {
    /// On the first start: each shard's replicas by the token ring over the
    /// initial members (all of them when there are no more members than
    /// replicas); a joining node starts with none. Later starts reopen
    /// exactly the replicas recorded in the store, however membership
    /// changed since.
    fn of(config: &NodeConfig, store: &Store) -> Result<Placement, StartError> {
        let members = config.initial_members()?;
        let ring = tocsin_core::routing::Ring::new(members.iter().map(|m| m.id));
        let replication = config.replication_factor.min(members.len());
        let store_err = |source| StartError::Store { path: config.data_dir.display().to_string(), source };
        let recorded = store.hosted_groups().map_err(store_err)?;
        // The metadata group starts on the lowest-id initial members.
        let meta_voters = crate::control::meta::initial_voters(&members);
        let node_id = config.node_id;
        let (hosted, host_meta, bootstrapped): (Vec<ShardId>, bool, bool) = match &recorded {
            Some(h) => (
                h.groups.iter().filter(|g| **g < u64::from(config.num_shards)).map(|g| *g as ShardId).collect(),
                h.groups.contains(&tocsin_store::keys::META_GROUP),
                h.bootstrapped,
            ),
            None if config.join => (Vec::new(), false, true),
            None => (
                (0..config.num_shards).filter(|s| ring.replicas(*s, replication).contains(&node_id)).collect(),
                meta_voters.contains(&node_id),
                false,
            ),
        };
        Ok(Placement { members, ring, replication, meta_voters, hosted, host_meta, bootstrapped })
    }

    /// Until the first start has bootstrapped, the lowest-id replica of
    /// each group writes its first membership. Never afterwards: a replica
    /// hosted later waits, uninitialized, to be added by its leader.
    async fn bootstrap(&self, state: &Arc<NodeState>) -> Result<(), StartError> {
        let node_id = state.node_id;
        let voters_of = |ids: &[u64]| -> BTreeMap<u64, NodeAddr> {
            self.members
                .iter()
                .filter(|m| ids.contains(&m.id))
                .map(|m| {
                    let addr = if m.id == node_id {
                        state.self_addr.clone()
                    } else {
                        NodeAddr { grpc_addr: m.grpc.clone(), http_addr: m.http.clone(), peer_addr: m.peer.clone() }
                    };
                    (m.id, addr)
                })
                .collect()
        };
        if let Some(meta) = state.meta()
            && self.meta_voters.first() == Some(&node_id)
            && !meta.raft.is_initialized().await.unwrap_or(true)
        {
            let voters = voters_of(self.meta_voters.as_slice());
            if let Err(e) = meta.raft.initialize(voters).await {
                tracing::warn!(error = %e, "initializing the metadata group failed (already initialized?)");
            }
        }
        for shard in &self.hosted {
            let replicas = self.ring.replicas(*shard, self.replication);
            if replicas.iter().min() != Some(&node_id) {
                continue;
            }
            let voters = voters_of(replicas.as_slice());
            let Some(ctx) = state.shards.get(*shard) else { continue };
            if !ctx.raft.is_initialized().await.unwrap_or(true)
                && let Err(e) = ctx.raft.initialize(voters).await
            {
                tracing::warn!(shard, error = %e, "initializing a group failed (already initialized elsewhere?)");
            }
        }
        state.persist_hosted(true).await
    }
}

/// Builds what every handler and background task shares: delivery,
/// admission, the Raft router (told the initial members' addresses), and
/// the runtimes' handles.
fn shared_state(
    config: &Arc<NodeConfig>,
    store: Arc<Store>,
    metrics: Option<PrometheusHandle>,
    placement: &Placement,
    raft_runtime: &SideRuntime,
    fire_runtime: &SideRuntime,
) -> Result<Arc<NodeState>, StartError> {
    let node_id = config.node_id;
    let secrets = config.signing_keys()?;
    let egress = Arc::new(config.delivery.egress_policy()?);
    let webhook =
        WebhookSender::new(config.delivery.clone(), secrets, egress).map_err(|e| StartError::Webhook(e.to_string()))?;
    let dispatcher = Arc::new(Dispatcher {
        webhook: Arc::new(webhook),
        amqp: Arc::new(crate::shard::delivery::amqp::AmqpSender::new(&config.delivery.amqp_brokers)),
        pull: PullHub::new(config.delivery.clone()),
    });
    let admission = Admission::start(config.admission.clone(), config.data_dir.clone());
    admission.watch_fire_lag(fire_runtime.lag_us());
    let clock = Clock::system(config.max_clock_offset_ms);
    let peer_tls = match config.peer_tls_files()? {
        Some(files) => Some(crate::peer_tls::PeerTls::load(&files, node_id)?),
        None => None,
    };
    let router = Router::new(
        node_id,
        Duration::from_millis(config.raft.rpc_timeout_ms),
        Duration::from_millis(config.raft.election_timeout_max_ms),
        clock.clone(),
        raft_runtime.handle().clone(),
        peer_tls.clone(),
    );
    for m in &placement.members {
        if m.id != node_id {
            router.set_addr(m.id, &m.peer);
        }
    }
    let authority = crate::auth::Authority::new(config)?;
    let map = MapCache::default();
    let signer = dispatcher.webhook.clone();
    map.on_learn(move |map| {
        signer.set_map_secrets(map);
        signer.paused().learn(map);
    });
    Ok(Arc::new(NodeState {
        config: config.clone(),
        node_id,
        authority,
        self_addr: NodeAddr {
            grpc_addr: config.grpc_advertise(),
            http_addr: config.http_advertise(),
            peer_addr: config.peer_advertise(),
        },
        clock,
        store,
        shards: ShardTable::default(),
        groups: Groups::default(),
        router,
        raft_config: openraft_config(&config.raft),
        raft_runtime: raft_runtime.handle().clone(),
        fire_runtime: fire_runtime.handle().clone(),
        hosting: tokio::sync::Mutex::new(()),
        dispatcher,
        admission,
        metrics,
        forwarder: Arc::new(Forwarder::new(
            Duration::from_millis(config.admission.request_timeout_ms),
            peer_tls.clone(),
        )),
        peer_tls,
        remote_view: std::sync::RwLock::new(None),
        meta: std::sync::RwLock::new(None),
        map,
        moves: Arc::new(tokio::sync::Semaphore::new(MOVES_AT_ONCE)),
        shutting_down: AtomicBool::new(false),
        campaigning: Default::default(),
        quiet: Default::default(),
    }))
}

/// See `serve_grpc`.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1_000;

/// The client port: TimerService and AdminService. The peer services are
/// answered PERMISSION_DENIED here (`api::peer::refused_on_client_port`),
/// and a Raft link's preface is not recognised: it is served on the peer
/// port only.
async fn serve_client_grpc(
    state: Arc<NodeState>,
    listener: TcpListener,
    tls: Option<Arc<crate::client_tls::ClientTls>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let max = state.config.admission.max_request_bytes;
    let timers = pb::timer_service_server::TimerServiceServer::new(TimerApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(64 << 20);
    let admin = pb::admin_service_server::AdminServiceServer::new(AdminApi::new(state.clone()));
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(state.clone(), health, shutdown.clone()));
    let (reflection_v1, reflection_v1alpha) = reflection_services();
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .layer(crate::telemetry::GrpcRequestsLayer::new(state.config.access_log))
        // As on the peer port (see there): a client whose calls time out
        // resets their streams, and with h2's default of 20 the server
        // closed the client's whole connection, failing every other call on
        // it (chaos `flapping-partitions`: "remotely-reset pending-accept
        // streams reached limit (20)" on every node, tens of thousands of
        // creates with an unknown outcome).
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .add_service(timers)
        .add_service(admin)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(crate::api::peer::RefuseTransport)
        .add_service(crate::api::peer::RefuseReplicas);
    let stopped = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let result = match tls {
        // The TLS accept loop sets TCP_NODELAY itself.
        Some(tls) => router.serve_with_incoming_shutdown(tls.grpc_incoming(listener), stopped).await,
        None => {
            // `Server::tcp_nodelay` applies only to listeners tonic binds itself:
            // set it on each accepted connection, or a small answer waits out the
            // peer's delayed ACK (about 40 ms per call, measured: 23 creates/s at
            // concurrency 1 instead of hundreds).
            let incoming =
                tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |conn| {
                    conn.inspect(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    })
                });
            router.serve_with_incoming_shutdown(incoming, stopped).await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "client grpc server stopped");
    }
}

/// The services a client port lists through gRPC health and reflection.
const CLIENT_SERVICES: [&str; 2] = ["tocsin.v1.TimerService", "tocsin.v1.AdminService"];

/// Keeps `grpc.health.v1.Health` in step with readiness
/// (`NodeState::not_ready_reason`, what `GET /readyz` answers): the whole
/// server (`""`) and each client service are SERVING exactly when the node
/// is ready, so Kubernetes gRPC probes and gRPC load balancers see what the
/// HTTP probe sees. NOT_SERVING from the moment shutdown begins, so
/// balancers drain the node while it hands over its leaderships.
async fn report_health(
    state: Arc<NodeState>,
    reporter: tonic_health::server::HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) {
    use tonic_health::ServingStatus;
    let mut last = None;
    loop {
        let status =
            if state.not_ready_reason().is_none() { ServingStatus::Serving } else { ServingStatus::NotServing };
        if last != Some(status) {
            for name in std::iter::once("").chain(CLIENT_SERVICES) {
                reporter.set_service_status(name, status).await;
            }
            last = Some(status);
        }
        let stopping = tokio::select! {
            () = crate::grid::sleep_to_next_line(Duration::from_millis(250)) => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        if stopping {
            for name in std::iter::once("").chain(CLIENT_SERVICES) {
                reporter.set_service_status(name, ServingStatus::NotServing).await;
            }
            return;
        }
    }
}

/// Server reflection (v1 and v1alpha, which older grpcurl builds ask for):
/// lists the client services, health and reflection itself, and describes
/// every message they use. The peer services' files are in the descriptor
/// set, but they are not listed: this port refuses them.
fn reflection_services() -> (
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    tonic_reflection::server::v1alpha::ServerReflectionServer<impl tonic_reflection::server::v1alpha::ServerReflection>,
) {
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tocsin_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("grpc.health.v1.Health");
        for name in CLIENT_SERVICES {
            b = b.with_service_name(name);
        }
        b
    };
    // The descriptor sets are compiled in; a failure here is a build defect.
    let v1 = builder()
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .expect("the compiled-in descriptor sets are valid");
    let v1alpha = builder()
        .with_service_name("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()
        .expect("the compiled-in descriptor sets are valid");
    (v1, v1alpha)
}

/// The peer port: Raft links and transport, replica control, requests
/// forwarded from other nodes (TimerService) and the shard maps nodes read
/// from each other (AdminService's reads; its operations are refused here).
async fn serve_peer_grpc(
    state: Arc<NodeState>,
    listener: TcpListener,
    spool: std::path::PathBuf,
    mut shutdown: watch::Receiver<bool>,
    raft: tokio::runtime::Handle,
) {
    let max = state.config.admission.max_request_bytes;
    let timers = pb::timer_service_server::TimerServiceServer::new(TimerApi::for_peers(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(64 << 20);
    let admin = pb::admin_service_server::AdminServiceServer::new(AdminApi::peer_reads_only(state.clone()));
    let replicas =
        pb::replica_control_server::ReplicaControlServer::new(crate::api::peer::ReplicaService::new(state.clone()));
    let transport = Arc::new(TransportService::new(
        state.groups.clone(),
        spool,
        state.clock.clone(),
        state.admission.disk_low_flag(),
        state.quiet.clone(),
    ));
    // Raft messages come on their own links (`link.rs`), told apart from
    // HTTP/2 by their first byte (or, with peer TLS, by ALPN); everything
    // else is gRPC.
    let incoming = crate::shard::link::split_incoming(listener, transport.clone(), raft, state.peer_tls.clone());
    let transport = pb::raft_transport_server::RaftTransportServer::from_arc(transport)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let result = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // h2's rapid-reset guard closes a whole connection once 20 streams
        // are reset before the server accepted them. After a partition
        // heals (or through a slow link), a peer's timed-out Raft RPCs and
        // forwarded requests arrive as HEADERS and RST_STREAM together, so
        // the guard tripped 61-76 times per node in one chaos
        // `flapping-partitions` run, and every group's RPCs on the peer
        // connection failed with it. Still bounded, so a client cannot make
        // the server track resets without end.
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .add_service(timers)
        .add_service(admin)
        .add_service(replicas)
        .add_service(transport)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "peer grpc server stopped");
    }
}

async fn serve_http(
    state: Arc<NodeState>,
    listener: TcpListener,
    tls: Option<Arc<crate::client_tls::ClientTls>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = crate::api::http::router(state);
    let stopped = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let result = match tls {
        // The TLS accept loop sets TCP_NODELAY itself.
        Some(tls) => match tls.http_listener(listener) {
            Ok(listener) => axum::serve(listener, app).with_graceful_shutdown(stopped).await,
            Err(e) => Err(e),
        },
        None => {
            axum::serve(
                listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .with_graceful_shutdown(stopped)
            .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "http server stopped");
    }
}
