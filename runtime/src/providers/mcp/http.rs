//! A toolbox served over MCP's streamable HTTP transport, behind authentication (feature
//! `mcp-http`).
//!
//! Every HTTP request passes the [`Authenticator`] first. One that proves nothing is answered
//! `401 Unauthorized` (or `403 Forbidden`, as the authenticator says) before the MCP layer reads
//! it, so nothing runs for a caller nobody vouched for. One that proves a [`Principal`] runs as
//! that principal:
//!
//! - **Tenant.** The principal fixes the tenant of every call it makes (`ctx.tenant`), and
//!   records are kept per tenant: no client can choose, change or reach another tenant.
//! - **Run ids.** A run id or event id a client names in `_meta` (`toolkey/run_id`,
//!   `toolkey/event_id`) is accepted and scoped to the principal
//!   ([`ClientRunIds::Principal`](super::ClientRunIds::Principal)): a client that reconnects
//!   and names its run again continues it — its retry replays — and a principal naming another
//!   principal's run id names a run of its own. Calls that name no run share their session's
//!   run, as over stdio; a request in no session (the 2026-07-28 protocol) has no run, so a
//!   call whose key needs one must name it (see [Run ids](super#run-ids)).
//! - **Sessions.** An MCP session belongs to the principal that opened it, its id in its
//!   tenant: a request of another principal naming its session id is answered `404 Not Found`,
//!   as for a session that does not exist, so nobody else can call, listen on or close it.
//! - **Progress.** [`ToolContext::progress`](crate::ToolContext::progress) sends
//!   `notifications/progress` to a client that asked for them, on the request's own stream.
//!
//! ```no_run
//! use toolkey::providers::mcp::http::{bearer_token, McpHttp, Parts, Principal, Refusal};
//! use toolkey::Toolbox;
//!
//! # async fn serve(toolbox: Toolbox) -> std::io::Result<()> {
//! let mcp = McpHttp::new(toolbox, |request: &Parts| {
//!     match bearer_token(request) {
//!         // Look the token up in your own user store; the principal's tenant keeps its records.
//!         Some("secret-of-acme") => Ok(Principal::new("user-17").with_tenant("acme")),
//!         _ => Err(Refusal::unauthenticated("a valid bearer token is required")),
//!     }
//! });
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! // Serves until the second future completes: a shutdown signal, here never.
//! mcp.serve(listener, std::future::pending()).await
//! # }
//! ```
//!
//! [`McpHttp::router`] gives the same endpoint as an axum [`Router`] to mount in an app of your
//! own (`Router::new().nest("/mcp", mcp.router())`).
//!
//! # OAuth
//!
//! The endpoint is an OAuth 2.1 resource server as MCP's authorization specification has it,
//! once given its [`ProtectedResource`]:
//!
//! - its metadata (RFC 9728) is served at its well-known URI
//!   ([`McpHttp::well_known_router`]), and every `401` names it in a
//!   `WWW-Authenticate: Bearer resource_metadata="…"` challenge, with `error="invalid_token"`
//!   when a token was given and refused (RFC 6750 §3.1);
//! - a tool may [require scopes](McpHttp::require_scopes): a principal without them is not
//!   shown it, and its call is answered `403` with `error="insufficient_scope"` and the scopes,
//!   before anything runs;
//! - the `Authorization` header is removed once it proved the principal: no tool sees the
//!   token, so none can pass it on.
//!
//! Tokens are the authenticator's to check: [`JwtAuthenticator`](super::oauth::JwtAuthenticator)
//! (feature `mcp-oauth`) checks JWTs against the issuer's keys, for this resource's audience;
//! an authenticator of your own grants scopes with [`Principal::with_scopes`].

// `JwtAuthenticator` exists with feature `mcp-oauth` only; the docs name it either way.
#![cfg_attr(not(feature = "mcp-oauth"), allow(rustdoc::broken_intra_doc_links))]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{header, HeaderValue, Method, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::McpServer;
use crate::Toolbox;

mod resource;

pub(crate) use resource::RequiredScopes;
pub use resource::{ConfigError, ProtectedResource};

/// A request's method, URI, headers and extensions, as an [`Authenticator`] sees them (the
/// `http` crate's `request::Parts`).
pub use http::request::Parts;

/// Who a request's credentials proved the caller to be: an id that scopes the run ids it names,
/// and the tenant its calls run for.
///
/// ```
/// use toolkey::providers::mcp::http::Principal;
///
/// let alice = Principal::new("alice");
/// assert_eq!((alice.id(), alice.tenant()), ("alice", "alice"));
/// // Two users of one customer account share its records, and each keeps its own runs.
/// let bob = Principal::new("bob").with_tenant("acme");
/// assert_eq!((bob.id(), bob.tenant()), ("bob", "acme"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    id: Arc<str>,
    tenant: Arc<str>,
    scopes: Arc<[String]>,
}

impl Principal {
    /// The principal `id`, which is also its tenant.
    ///
    /// The id must identify the caller: two callers given one id share their runs.
    pub fn new(id: impl Into<String>) -> Self {
        let id: Arc<str> = Arc::from(id.into());
        Principal {
            tenant: id.clone(),
            id,
            scopes: Arc::from([]),
        }
    }

    /// Calls run for `tenant` instead of a tenant of the principal's own, so the principals of
    /// one account share its records (a business key such as `invoice:<customer>:<period>`
    /// names one action for all of them); run ids stay the principal's own.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Arc::from(tenant.into());
        self
    }

    /// The OAuth scopes the caller's credentials grant (none when not set): a tool that
    /// [requires scopes](McpHttp::require_scopes) is listed to, and runs for, a principal
    /// granted every one of them.
    ///
    /// ```
    /// use toolkey::providers::mcp::http::Principal;
    ///
    /// let bob = Principal::new("bob").with_scopes(["invoices:read", "invoices:write"]);
    /// assert!(bob.has_scope("invoices:write"));
    /// assert!(!Principal::new("carol").has_scope("invoices:write"));
    /// ```
    pub fn with_scopes(mut self, scopes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The scopes the credentials grant.
    pub fn scopes(&self) -> &[String] {
        &self.scopes
    }

    /// Whether the credentials grant `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|granted| granted == scope)
    }

    /// Whether two principals are one caller: the same id in the same tenant, whatever scopes
    /// each token grants.
    fn same_caller(&self, other: &Principal) -> bool {
        self.id == other.id && self.tenant == other.tenant
    }
}

/// Why a request was not let in: `401 Unauthorized` with a `WWW-Authenticate: Bearer`
/// challenge, `403 Forbidden`, or `503 Service Unavailable`, with a JSON body that names the
/// reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    /// No credentials, or credentials that prove nothing: `401 Unauthorized`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
        }
    }

    /// Valid credentials of a caller that may not use this server: `403 Forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
        }
    }

    /// Credentials the server cannot check now (the identity provider does not answer):
    /// `503 Service Unavailable`. The client may try again later with the same credentials.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
        }
    }

    /// The HTTP status the request is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The reason, as the client reads it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let code = match self.status {
            StatusCode::FORBIDDEN => "FORBIDDEN",
            StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
            _ => "UNAUTHENTICATED",
        };
        let body = serde_json::json!({"error": {"code": code, "message": self.message}});
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_string(),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Turns a request's credentials into the [`Principal`] it runs as, or refuses it.
///
/// It sees the request's method, URI and headers (the body is not read yet). A closure
/// `Fn(&Parts) -> Result<Principal, Refusal>` is an authenticator; implement the
/// trait for one that awaits (a token introspection endpoint, a database).
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// The principal the request's credentials prove, or why it is refused.
    async fn authenticate(&self, request: &Parts) -> Result<Principal, Refusal>;
}

#[async_trait]
impl<F> Authenticator for F
where
    F: Fn(&Parts) -> Result<Principal, Refusal> + Send + Sync + 'static,
{
    async fn authenticate(&self, request: &Parts) -> Result<Principal, Refusal> {
        self(request)
    }
}

/// The token of an `Authorization: Bearer <token>` header; `None` without one.
///
/// ```
/// use toolkey::providers::mcp::http::bearer_token;
///
/// let (parts, ()) = http::Request::builder()
///     .header("authorization", "Bearer tok-1")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(bearer_token(&parts), Some("tok-1"));
/// ```
pub fn bearer_token(request: &Parts) -> Option<&str> {
    let value = request.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A toolbox served over MCP's streamable HTTP transport, every request authenticated first.
/// See the [module docs](self) for what a principal decides.
pub struct McpHttp {
    server: McpServer,
    authenticator: Arc<dyn Authenticator>,
    allowed_hosts: Option<Vec<String>>,
    resource: Option<ProtectedResource>,
    required_scopes: RequiredScopes,
    shutdown: CancellationToken,
}

impl McpHttp {
    /// Serves `toolbox` to the callers `authenticator` lets in.
    pub fn new(toolbox: Toolbox, authenticator: impl Authenticator) -> Self {
        McpHttp {
            server: McpServer::new(toolbox),
            authenticator: Arc::new(authenticator),
            allowed_hosts: None,
            resource: None,
            required_scopes: RequiredScopes::default(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Serves as the OAuth 2.1 protected resource `resource` (see [OAuth](self#oauth)): its
    /// metadata at RFC 9728's well-known path ([`well_known_router`](Self::well_known_router)),
    /// and every `401 Unauthorized` a challenge that names it
    /// (`Bearer resource_metadata="…"`, with `error="invalid_token"` when a token was given
    /// and refused), so a client finds the authorization server from the refusal.
    pub fn with_protected_resource(mut self, resource: ProtectedResource) -> Self {
        self.resource = Some(resource);
        self
    }

    /// Requires `scopes` of every call of `tool`, beside those already required: a principal
    /// not granted all of them ([`Principal::with_scopes`]) is not shown the tool in
    /// `tools/list`, and its call is answered `403 Forbidden` with
    /// `WWW-Authenticate: Bearer error="insufficient_scope", scope="…"`, before anything runs.
    ///
    /// The tool's status companion, which answers what the tool did and returned, requires the
    /// same scopes unless it is given scopes of its own here (as `invoice_status` below).
    ///
    /// An error when the toolbox has no tool `tool`, or a scope is not an OAuth scope (empty,
    /// or with a space, `"`, `\` or a character outside printable ASCII).
    ///
    /// ```
    /// # use toolkey::providers::mcp::http::{McpHttp, Parts, Principal, Refusal};
    /// # fn build(toolbox: toolkey::Toolbox, authenticate: fn(&Parts) -> Result<Principal, Refusal>)
    /// # -> Result<McpHttp, toolkey::providers::mcp::http::ConfigError> {
    /// let mcp = McpHttp::new(toolbox, authenticate)
    ///     .require_scopes("send_invoice", ["invoices:write"])?
    ///     .require_scopes("invoice_status", ["invoices:read"])?;
    /// # Ok(mcp) }
    /// ```
    pub fn require_scopes(
        mut self,
        tool: &str,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Self, ConfigError> {
        let Some(def) = self.server.toolbox().definition(tool) else {
            return Err(ConfigError::UnknownTool(tool.to_string()));
        };
        if let Some(companion) = def.status_tool() {
            self.required_scopes.companion(companion, tool);
        }
        self.required_scopes.add(tool, scopes)?;
        Ok(self)
    }

    /// The protected resource's metadata as an axum router to merge at the root of your app
    /// (`Router::new().nest("/mcp", mcp.router()).merge(mcp.well_known_router())`):
    /// `/.well-known/oauth-protected-resource` followed by the resource's path, and without
    /// it. Answers nothing without [`with_protected_resource`](Self::with_protected_resource);
    /// [`serve`](Self::serve) merges it itself. The metadata is public, as RFC 9728 has it.
    pub fn well_known_router(&self) -> Router {
        match &self.resource {
            Some(resource) => resource.router(&self.required_scopes),
            None => Router::new(),
        }
    }

    /// The name and version the server gives clients at `initialize`.
    pub fn with_server_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.server = self.server.with_server_info(name, version);
        self
    }

    /// Instructions for the model, sent to clients at `initialize`.
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.server = self.server.with_instructions(instructions);
        self
    }

    /// How long a keyed call of a client that accepts tasks runs before it continues as an MCP
    /// task (10 s when not set); `None` offers no tasks. See
    /// [`McpServer::with_tasks_after`](super::McpServer::with_tasks_after).
    pub fn with_tasks_after(mut self, after: Option<std::time::Duration>) -> Self {
        self.server = self.server.with_tasks_after(after);
        self
    }

    /// The host names (or `host:port`) the server answers to, checked against each request's
    /// `Host` header so that a web page cannot reach a server on a private network by DNS
    /// rebinding. Loopback names only (`localhost`, `127.0.0.1`, `::1`) when not set: a public
    /// deployment names its own, `["mcp.example.com"]`.
    ///
    /// An empty list allows no host: every request is answered `403 Forbidden`, saying so (a
    /// configured list that came out empty must not turn the check off).
    pub fn with_allowed_hosts(
        mut self,
        hosts: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.allowed_hosts = Some(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// The endpoint as an axum router answering MCP on every path it is given, the
    /// authentication layer included; mount it where your app wants it:
    /// `Router::new().nest("/mcp", mcp.router())`.
    ///
    /// Each router keeps its own sessions. Open sessions end when a client closes them or goes
    /// idle; [`serve`](Self::serve) also closes them on shutdown, and an app serving the router
    /// itself waits for their streams in a graceful shutdown. Call
    /// [`Toolbox::shutdown`] after serving, so bodies still running finish.
    pub fn router(&self) -> Router {
        let mut config = StreamableHttpServerConfig::default()
            .with_cancellation_token(self.shutdown.child_token());
        // rmcp reads an empty list as "every host": toolkey refuses every request itself.
        let no_host = self.allowed_hosts.as_ref().is_some_and(Vec::is_empty);
        if no_host {
            tracing::error!("toolkey: the MCP endpoint allows no host (its allowed hosts are an empty list): every request is refused");
        }
        if let Some(hosts) = &self.allowed_hosts {
            config = config.with_allowed_hosts(hosts.clone());
        }
        let scopes = Arc::new(self.required_scopes.clone());
        let template = Arc::new(self.server.authenticated_session(scopes.clone()));
        let session_scopes = scopes.clone();
        let sessions = Arc::new(LocalSessionManager::default());
        let service = StreamableHttpService::new(
            move || Ok(template.authenticated_session(session_scopes.clone())),
            sessions.clone(),
            config,
        );
        let gate = Arc::new(Gate {
            no_host,
            authenticator: self.authenticator.clone(),
            resource: self.resource.clone(),
            scopes,
            sessions,
            owners: Mutex::default(),
        });
        Router::new()
            .fallback_service(service)
            .layer(axum::middleware::from_fn_with_state(gate, authenticate))
    }

    /// Serves the endpoint at `/mcp` on `listener` until `shutdown` completes, then closes the
    /// open sessions and waits for tool bodies still running (see [`Toolbox::shutdown`]). A
    /// [protected resource](Self::with_protected_resource)'s metadata is served too, at its
    /// well-known paths.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .nest("/mcp", self.router())
            .merge(self.well_known_router());
        let sessions = self.shutdown.clone();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                // Open SSE streams end with their sessions, so the graceful shutdown can finish.
                sessions.cancel();
            })
            .await;
        // Each write the store did not take is logged by the shutdown itself.
        let _ = self.server.toolbox().shutdown().await;
        served
    }
}

/// The header that names a request's MCP session.
const SESSION_ID: &str = "mcp-session-id";

/// What every request passes before the MCP layer: the authenticator, and which principal
/// opened each live session.
struct Gate {
    /// The allowed hosts are an empty list: no request is let in.
    no_host: bool,
    authenticator: Arc<dyn Authenticator>,
    /// The OAuth protected resource the challenges name, when there is one.
    resource: Option<ProtectedResource>,
    scopes: Arc<RequiredScopes>,
    sessions: Arc<LocalSessionManager>,
    owners: Mutex<Owners>,
}

/// The principal of each session this endpoint opened (its id and its tenant: the same id in
/// another tenant is another caller), and the size at which ended sessions are next swept out.
#[derive(Default)]
struct Owners {
    by_session: HashMap<String, Principal>,
    sweep_at: usize,
}

impl Gate {
    fn owner(&self, session: &str) -> Option<Principal> {
        let owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        owners.by_session.get(session).cloned()
    }

    async fn opened(&self, session: String, principal: &Principal) {
        let sweep = {
            let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
            owners.by_session.insert(session, principal.clone());
            owners.by_session.len() > owners.sweep_at
        };
        if sweep {
            // Sessions end without a DELETE too (idle, dropped): forget those rmcp forgot.
            let live = self.sessions.sessions.read().await;
            let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
            owners
                .by_session
                .retain(|session, _| live.contains_key(session.as_str()));
            owners.sweep_at = (owners.by_session.len() * 2).max(64);
        }
    }

    /// The refusal as its response; a `401` names the protected resource's metadata, and says
    /// `invalid_token` when the request carried a token (RFC 6750 §3.1).
    fn refused(&self, refusal: Refusal, had_token: bool) -> Response {
        let message = refusal.message().to_string();
        let status = refusal.status();
        let mut response = refusal.into_response();
        if let (Some(resource), StatusCode::UNAUTHORIZED) = (&self.resource, status) {
            let metadata = ("resource_metadata", resource.metadata_url());
            let params = if had_token {
                vec![
                    ("error", "invalid_token"),
                    metadata,
                    ("error_description", message.as_str()),
                ]
            } else {
                vec![metadata]
            };
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, resource::challenge(&params));
        }
        response
    }

    fn closed(&self, session: &str) {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        owners.by_session.remove(session);
    }
}

/// The authentication layer: the request's principal into its extensions, where the MCP server
/// reads it for every call, or the refusal as the response. A request naming a session only
/// reaches it when its principal opened it: any other is told the session does not exist, so a
/// session id that leaks lets no one else call, listen on or close the session.
async fn authenticate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    if gate.no_host {
        return no_host_allowed();
    }
    let (mut parts, body) = request.into_parts();
    // Whatever an earlier layer put there, only what this authenticator proves counts.
    parts.extensions.remove::<Principal>();
    let principal = match gate.authenticator.authenticate(&parts).await {
        Ok(principal) => principal,
        Err(refusal) => return gate.refused(refusal, bearer_token(&parts).is_some()),
    };
    // The token proved who calls; nothing past this point sees it, so no tool can pass it on.
    parts.headers.remove(header::AUTHORIZATION);
    let session = match parts.headers.get(SESSION_ID) {
        None => None,
        Some(value) => match value.to_str() {
            Ok(session)
                if gate
                    .owner(session)
                    .is_some_and(|owner| owner.same_caller(&principal)) =>
            {
                Some(session.to_string())
            }
            _ => return session_not_found(),
        },
    };
    let body = if gate.scopes.is_empty() || parts.method != Method::POST {
        body
    } else {
        // A call of a tool the token may not use is refused here, with the status and
        // challenge OAuth clients act on; the MCP layer never sees it.
        let Ok(bytes) = axum::body::to_bytes(body, resource::BODY_LIMIT).await else {
            return resource::unreadable_body();
        };
        if let Some((tool, required)) = gate.scopes.refused_call(&bytes, &principal) {
            return resource::insufficient_scope(&tool, required, gate.resource.as_ref());
        }
        axum::body::Body::from(bytes)
    };
    let closing = parts.method == Method::DELETE;
    parts.extensions.insert(principal.clone());
    let response = next.run(Request::from_parts(parts, body)).await;
    match session {
        None => {
            let opened = response.headers().get(SESSION_ID);
            if let Some(opened) = opened.and_then(|value| value.to_str().ok()) {
                gate.opened(opened.to_string(), &principal).await;
            }
        }
        Some(session) if closing && response.status().is_success() => gate.closed(&session),
        Some(_) => {}
    }
    response
}

/// The answer to every request of an endpoint whose allowed hosts are an empty list.
fn no_host_allowed() -> Response {
    let body = serde_json::json!({"error": {"code": "HOST_NOT_ALLOWED",
        "message": "this MCP endpoint allows no host: its list of allowed hosts is empty; its operator must name the hosts it answers to"}});
    (
        StatusCode::FORBIDDEN,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// What MCP's streamable HTTP transport answers for a session it does not know: the client
/// starts a session of its own.
fn session_not_found() -> Response {
    let body = serde_json::json!({"error": {"code": "SESSION_NOT_FOUND",
        "message": "no such MCP session: start a session of your own with `initialize`"}});
    (
        StatusCode::NOT_FOUND,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}
