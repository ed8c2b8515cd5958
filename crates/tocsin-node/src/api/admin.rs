//! The `AdminService`: cluster info and the shard map, as this node sees
//! them (the cluster map it caches, and its Raft groups' metrics and
//! memberships), and the cluster operations of `ops.rs`.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;

use tocsin_proto::v1 as pb;
use tonic::Request;
use tonic::Response;
use tonic::Status;

use tocsin_core::auth::Scope;
use tocsin_core::auth::TokenRecord;
use tocsin_core::cluster::ClusterCommand;
use tocsin_core::cluster::ClusterOutcome;
use tocsin_core::cluster::NamespaceQuota;
use tocsin_core::cluster::Secret;
use tocsin_core::cluster::SecretChange;
use tocsin_core::cluster::TokenChange;

use crate::control::ops;
use crate::control::report;
use crate::control::state::NodeState;
use crate::error::NodeError;

#[derive(Clone)]
pub struct AdminApi {
    node: Arc<NodeState>,
    /// Whether cluster operations are served and calls checked against
    /// bearer tokens (the client port), or only the reads nodes make of
    /// each other, unchecked (the peer port).
    operations: bool,
}

impl AdminApi {
    pub fn new(node: Arc<NodeState>) -> AdminApi {
        AdminApi { node, operations: true }
    }

    /// The peer port's AdminService: `GetCluster` and `GetShardMap` only.
    pub fn peer_reads_only(node: Arc<NodeState>) -> AdminApi {
        AdminApi { node, operations: false }
    }

    /// On the client port: refuses the call unless its token is known and,
    /// for `Some(Admin)`, grants admin. The peer port checks nothing.
    fn authorize<T>(&self, request: &Request<T>, scope: Option<Scope>) -> Result<(), Status> {
        if !self.operations {
            return Ok(());
        }
        let map = self.node.map.get();
        // A node with no cluster map yet (started with --join, not yet
        // added) holds nothing and knows no token: its reads answer, so
        // `node add` can ask it who it is.
        if scope.is_none() && !map.is_bootstrapped() {
            return Ok(());
        }
        let bearer = crate::auth::bearer_of(request.metadata());
        self.node.authority.check(&map, bearer, scope, &[]).map_err(Status::from)
    }

    /// A caller that names a newer map epoch (`x-tocsin-map-epoch`) makes
    /// this node refresh its map soon; the answer in hand is still the
    /// cached one.
    fn saw_epoch<T>(&self, request: &Request<T>) {
        let epoch = request.metadata().get(tocsin_contract::headers::MAP_EPOCH);
        if let Some(epoch) = epoch.and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()) {
            self.node.map.saw_epoch(epoch);
        }
    }

    /// A cluster operation or token call: the client port only, with a
    /// token that grants `admin`.
    fn admin_only<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.operable()?;
        self.authorize(request, Some(Scope::Admin))
    }

    /// Proposes a token, quota or secret command and tells every node the
    /// map epoch it made; `Some(epoch)` if it changed the map, `None` if
    /// there was nothing to do.
    async fn propose_token(&self, change: TokenChange) -> Result<(Option<u64>, u64), Status> {
        self.propose_and_announce(ClusterCommand::Token(change)).await
    }

    async fn propose_and_announce(&self, command: ClusterCommand) -> Result<(Option<u64>, u64), Status> {
        match crate::control::meta::propose(&self.node, command).await? {
            ClusterOutcome::Changed { epoch } => {
                crate::control::meta::announce(&self.node, epoch).await;
                Ok((Some(epoch), epoch))
            }
            ClusterOutcome::Unchanged { epoch } => Ok((None, epoch)),
            ClusterOutcome::Refused { error, .. } => Err(token_refusal(error).into()),
        }
    }

    fn operable(&self) -> Result<(), Status> {
        if self.operations {
            return Ok(());
        }
        Err(Status::permission_denied("cluster operations are served on the client port, not the peer port"))
    }

    pub async fn cluster_info_with_digests(&self) -> pb::ClusterInfo {
        report::cluster_info_with_digests(&self.node).await
    }

    pub async fn cluster_info(&self) -> pb::ClusterInfo {
        report::cluster_info(&self.node).await
    }

    pub async fn shard_map(&self) -> pb::ShardMap {
        report::shard_map(&self.node).await
    }
}

/// A refused token command: a cluster whose first map is still being
/// written is a moment away (UNAVAILABLE, retried by clients); anything
/// else is final.
fn token_refusal(error: tocsin_core::cluster::MapError) -> NodeError {
    match error {
        tocsin_core::cluster::MapError::NotBootstrapped => {
            NodeError::unavailable("the cluster map is not bootstrapped yet; retry", 200)
        }
        other => NodeError::FailedPrecondition(other.to_string()),
    }
}

type ProgressStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::Progress, Status>> + Send>>;

impl AdminApi {
    /// Runs a cluster operation in its own task (it finishes even if the
    /// caller goes away) and streams its progress.
    fn spawn_op<F, Fut>(&self, op: F) -> Response<ProgressStream>
    where
        F: FnOnce(Arc<NodeState>, ops::Reporter) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(ops::PROGRESS_QUEUE);
        tokio::spawn(op(self.node.clone(), ops::Reporter::new(tx)));
        Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl pb::admin_service_server::AdminService for AdminApi {
    async fn get_cluster(&self, request: Request<pb::GetClusterRequest>) -> Result<Response<pb::ClusterInfo>, Status> {
        self.authorize(&request, None)?;
        self.saw_epoch(&request);
        if request.into_inner().digests {
            return Ok(Response::new(self.cluster_info_with_digests().await));
        }
        Ok(Response::new(self.cluster_info().await))
    }

    async fn get_shard_map(&self, request: Request<pb::GetShardMapRequest>) -> Result<Response<pb::ShardMap>, Status> {
        self.authorize(&request, None)?;
        self.saw_epoch(&request);
        Ok(Response::new(self.shard_map().await))
    }

    type AddNodeStream = ProgressStream;
    async fn add_node(&self, request: Request<pb::AddNodeRequest>) -> Result<Response<Self::AddNodeStream>, Status> {
        self.admin_only(&request)?;
        let req = request.into_inner();
        if req.grpc_addr.is_empty() {
            return Err(NodeError::invalid("grpc_addr", "give the new node's gRPC address, host:port").into());
        }
        let addrs = ops::NewAddrs { grpc_addr: req.grpc_addr, http_addr: req.http_addr, peer_addr: req.peer_addr };
        Ok(self.spawn_op(|node, rep| ops::add_node(node, addrs, rep)))
    }

    type RemoveNodeStream = ProgressStream;
    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<Self::RemoveNodeStream>, Status> {
        self.admin_only(&request)?;
        let id = request.into_inner().node_id;
        Ok(self.spawn_op(move |node, rep| ops::remove_node(node, id, false, rep)))
    }

    type DecommissionNodeStream = ProgressStream;
    async fn decommission_node(
        &self,
        request: Request<pb::DecommissionNodeRequest>,
    ) -> Result<Response<Self::DecommissionNodeStream>, Status> {
        self.admin_only(&request)?;
        let id = request.into_inner().node_id;
        Ok(self.spawn_op(move |node, rep| ops::remove_node(node, id, true, rep)))
    }

    type MoveShardStream = ProgressStream;
    async fn move_shard(
        &self,
        request: Request<pb::MoveShardRequest>,
    ) -> Result<Response<Self::MoveShardStream>, Status> {
        self.admin_only(&request)?;
        let req = request.into_inner();
        Ok(self.spawn_op(move |node, rep| ops::move_shard(node, req.shard, req.from_node, req.to_node, rep)))
    }

    /// Moves a shard's leadership to `to_node`. Must reach the current
    /// leader; elsewhere it answers UNAVAILABLE with the leader's address.
    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        self.admin_only(&request)?;
        let req = request.into_inner();
        let ctx = self.node.shard(req.shard)?;
        let metrics = ctx.raft.metrics().borrow_watched().clone();
        if metrics.current_leader != Some(self.node.node_id) {
            return Err(crate::error::NodeError::from_propose(
                ctx.shard,
                crate::shard::proposer::ProposeError::NotLeader { leader: ctx.leader_hint() },
            )
            .into());
        }
        if !metrics.membership_config.membership().voter_ids().any(|id| id == req.to_node) {
            return Err(Status::invalid_argument(format!(
                "node {} is not a voter of shard {}",
                req.to_node, req.shard
            )));
        }
        if req.to_node != self.node.node_id {
            ctx.raft.trigger().transfer_leader(req.to_node).await.map_err(|e| Status::unavailable(e.to_string()))?;
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut rx = ctx.raft.metrics();
        loop {
            let leader = rx.borrow_watched().current_leader;
            if leader == Some(req.to_node) || tokio::time::Instant::now() > deadline {
                return Ok(Response::new(pb::TransferLeaderResponse { leader: leader.unwrap_or(0) }));
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), rx.changed()).await;
        }
    }

    type RebalanceStream = ProgressStream;
    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<Self::RebalanceStream>, Status> {
        self.admin_only(&request)?;
        let dry_run = request.into_inner().dry_run;
        Ok(self.spawn_op(move |node, rep| ops::rebalance(node, dry_run, rep)))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        self.admin_only(&request)?;
        let req = request.into_inner();
        let mut scopes = Vec::new();
        for name in &req.scopes {
            let scope = Scope::parse(name).ok_or_else(|| {
                NodeError::invalid("scopes", format!("{name:?} is not one of timers:write, timers:read, pull, admin"))
            })?;
            scopes.push(scope);
        }
        scopes.sort();
        scopes.dedup();
        let (id, token, secret_sha256) = crate::auth::new_token();
        let record = TokenRecord {
            secret_sha256,
            scopes,
            namespaces: req.namespaces.iter().map(|n| n.trim().to_string()).collect(),
            label: req.label,
            created_at_ms: self.node.clock.now_ms(),
        };
        record.check().map_err(|e| NodeError::invalid("scopes", e))?;
        match self.propose_token(TokenChange::Create { id: id.clone(), record }).await? {
            (Some(epoch), _) => Ok(Response::new(pb::CreateTokenResponse { id, token, map_epoch: epoch })),
            (None, _) => Err(NodeError::Internal("the token was not stored".into()).into()),
        }
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        self.admin_only(&request)?;
        let map = crate::control::meta::read_latest(&self.node).await?;
        let tokens = map
            .tokens
            .iter()
            .map(|(id, t)| pb::TokenInfo {
                id: id.clone(),
                scopes: t.scopes.iter().map(|s| s.name().to_string()).collect(),
                namespaces: t.namespaces.clone(),
                label: t.label.clone(),
                created_at_ms: t.created_at_ms,
            })
            .collect();
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        self.admin_only(&request)?;
        let id = request.into_inner().id;
        if !tocsin_core::auth::valid_token_id(&id) {
            return Err(NodeError::invalid("id", "a token id: 1 to 32 letters, digits or -").into());
        }
        let (changed, map_epoch) = self.propose_token(TokenChange::Revoke { id }).await?;
        Ok(Response::new(pb::RevokeTokenResponse { revoked: changed.is_some(), map_epoch }))
    }

    async fn set_namespace_quota(
        &self,
        request: Request<pb::SetNamespaceQuotaRequest>,
    ) -> Result<Response<pb::SetNamespaceQuotaResponse>, Status> {
        self.admin_only(&request)?;
        let q = request.into_inner().quota.unwrap_or_default();
        tocsin_core::validate::check_namespace(&q.namespace)
            .map_err(|e| NodeError::invalid("quota.namespace", e.to_string()))?;
        let quota = NamespaceQuota { max_pending: q.max_pending, creates_per_sec: q.creates_per_sec };
        let quota = (quota != NamespaceQuota::default()).then_some(quota);
        let (changed, map_epoch) =
            self.propose_and_announce(ClusterCommand::Quota { namespace: q.namespace, quota }).await?;
        Ok(Response::new(pb::SetNamespaceQuotaResponse { changed: changed.is_some(), map_epoch }))
    }

    async fn list_namespace_quotas(
        &self,
        request: Request<pb::ListNamespaceQuotasRequest>,
    ) -> Result<Response<pb::ListNamespaceQuotasResponse>, Status> {
        self.admin_only(&request)?;
        let map = crate::control::meta::read_latest(&self.node).await?;
        let quotas = map
            .quotas
            .iter()
            .map(|(ns, q)| pb::NamespaceQuota {
                namespace: ns.clone(),
                max_pending: q.max_pending,
                creates_per_sec: q.creates_per_sec,
            })
            .collect();
        Ok(Response::new(pb::ListNamespaceQuotasResponse { quotas }))
    }

    async fn set_namespace_secret(
        &self,
        request: Request<pb::SetNamespaceSecretRequest>,
    ) -> Result<Response<pb::SetNamespaceSecretResponse>, Status> {
        use pb::set_namespace_secret_request::Action;
        self.admin_only(&request)?;
        let req = request.into_inner();
        tocsin_core::validate::check_namespace(&req.namespace)
            .map_err(|e| NodeError::invalid("namespace", e.to_string()))?;
        let mut drawn = String::new();
        let change = match Action::try_from(req.action).unwrap_or(Action::Unspecified) {
            Action::Rotate => {
                let text = if req.secret.is_empty() {
                    drawn = crate::auth::new_webhook_secret();
                    drawn.clone()
                } else {
                    req.secret
                };
                // A malformed whsec_ secret is an error, never raw bytes.
                let bytes = tocsin_contract::signing::secret_bytes(&text).map_err(|_| {
                    NodeError::invalid("secret", "a whsec_ secret must be whsec_ followed by standard base64")
                })?;
                if !tocsin_core::cluster::SECRET_BYTES.contains(&bytes.len()) {
                    return Err(NodeError::invalid(
                        "secret",
                        format!("a signing secret has 24 to 64 bytes, not {}", bytes.len()),
                    )
                    .into());
                }
                SecretChange::Rotate { secret: Secret(bytes) }
            }
            Action::DropPrevious => SecretChange::DropPrevious,
            Action::Clear => SecretChange::Clear,
            Action::Unspecified => {
                return Err(NodeError::invalid("action", "one of ROTATE, DROP_PREVIOUS or CLEAR").into());
            }
        };
        let namespace = req.namespace.clone();
        let (changed, map_epoch) = self.propose_and_announce(ClusterCommand::Secret { namespace, change }).await?;
        let map = self.node.map.get();
        let fingerprint =
            map.secrets.get(&req.namespace).map(|s| crate::auth::fingerprint(&s.current.0)).unwrap_or_default();
        Ok(Response::new(pb::SetNamespaceSecretResponse {
            changed: changed.is_some(),
            map_epoch,
            secret: drawn,
            fingerprint,
        }))
    }

    async fn list_namespace_secrets(
        &self,
        request: Request<pb::ListNamespaceSecretsRequest>,
    ) -> Result<Response<pb::ListNamespaceSecretsResponse>, Status> {
        self.admin_only(&request)?;
        let map = crate::control::meta::read_latest(&self.node).await?;
        let secrets = map
            .secrets
            .iter()
            .map(|(ns, s)| pb::NamespaceSecretInfo {
                namespace: ns.clone(),
                fingerprints: s.keys().map(crate::auth::fingerprint).collect(),
                rotated_at_ms: s.rotated_at_ms,
            })
            .collect();
        Ok(Response::new(pb::ListNamespaceSecretsResponse { secrets }))
    }

    async fn set_paused(
        &self,
        request: Request<pb::SetPausedRequest>,
    ) -> Result<Response<pb::SetPausedResponse>, Status> {
        use tocsin_core::cluster::PauseTarget;
        self.admin_only(&request)?;
        let req = request.into_inner();
        let target = match (req.namespace.is_empty(), req.endpoint.is_empty()) {
            (false, true) => {
                tocsin_core::validate::check_namespace(&req.namespace)
                    .map_err(|e| NodeError::invalid("namespace", e.to_string()))?;
                PauseTarget::Namespace(req.namespace)
            }
            (true, false) => {
                let origin = crate::shard::delivery::webhook::origin_of(&req.endpoint);
                if !tocsin_core::cluster::is_origin(&origin) {
                    return Err(NodeError::invalid(
                        "endpoint",
                        "give an http(s) URL or its origin, scheme://host[:port]",
                    )
                    .into());
                }
                PauseTarget::Endpoint(origin)
            }
            _ => return Err(NodeError::invalid("namespace", "give a namespace or an endpoint, not both").into()),
        };
        let (changed, map_epoch) =
            self.propose_and_announce(ClusterCommand::Pause { target, paused: req.paused }).await?;
        Ok(Response::new(pb::SetPausedResponse { changed: changed.is_some(), map_epoch }))
    }

    async fn list_paused(
        &self,
        request: Request<pb::ListPausedRequest>,
    ) -> Result<Response<pb::ListPausedResponse>, Status> {
        self.admin_only(&request)?;
        let map = crate::control::meta::read_latest(&self.node).await?;
        let list = |m: &std::collections::BTreeMap<String, u64>| {
            m.iter().map(|(name, at)| pb::PausedInfo { name: name.clone(), paused_at_ms: *at }).collect()
        };
        Ok(Response::new(pb::ListPausedResponse {
            namespaces: list(&map.paused_namespaces),
            endpoints: list(&map.paused_endpoints),
        }))
    }

    async fn list_endpoints(
        &self,
        request: Request<pb::ListEndpointsRequest>,
    ) -> Result<Response<pb::ListEndpointsResponse>, Status> {
        self.authorize(&request, Some(Scope::Admin))?;
        let (endpoints, disabled) = self.node.dispatcher.webhook.endpoints_view(self.node.clock.now_ms());
        Ok(Response::new(pb::ListEndpointsResponse {
            node_id: self.node.node_id,
            endpoints: endpoints
                .into_iter()
                .map(|e| pb::EndpointInfo {
                    endpoint: e.endpoint,
                    state: e.state.into(),
                    failures_in_a_row: e.failures_in_a_row,
                    held_until_ms: e.held_until_ms,
                    in_flight: u32::try_from(e.in_flight).unwrap_or(u32::MAX),
                })
                .collect(),
            disabled: disabled
                .into_iter()
                .map(|d| pb::DisabledUrl { url: d.url, disabled_at_ms: d.disabled_at_ms, by_timer: d.by_timer })
                .collect(),
        }))
    }

    async fn enable_endpoint(
        &self,
        request: Request<pb::EnableEndpointRequest>,
    ) -> Result<Response<pb::EnableEndpointResponse>, Status> {
        self.authorize(&request, Some(Scope::Admin))?;
        let url = request.into_inner().url;
        if url.is_empty() {
            return Err(NodeError::invalid("url", "give the disabled callback URL").into());
        }
        let was_disabled = self.node.dispatcher.webhook.enable(&url);
        Ok(Response::new(pb::EnableEndpointResponse { node_id: self.node.node_id, was_disabled }))
    }
}
