//! The MCP server: a toolbox behind rmcp's `ServerHandler`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ResultType,
    ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};

use super::tasks::{self, Answer, Owner};
use super::{call_context, call_tool_result, handle_tools_call, ClientRunIds};
use crate::{texts, ToolContext, Toolbox};

/// A toolbox served over MCP: `tools/list` from its definitions (annotations included),
/// `tools/call` through [`Toolbox::call`], so keys, replays, `IN_PROGRESS` and `CONFLICT` hold
/// over MCP as they do in process.
///
/// It implements rmcp's [`ServerHandler`], so it can be served on any rmcp transport;
/// [`serve_stdio`](Self::serve_stdio) serves it on stdin and stdout. See the
/// [module docs](super#run-ids) for where the run id of a call comes from, and
/// [Tasks](super#tasks) for how a long call continues as a task.
///
/// ```no_run
/// use toolkey::providers::mcp::McpServer;
/// use toolkey::Toolbox;
///
/// # async fn serve() -> std::io::Result<()> {
/// let toolbox = Toolbox::builder().build().expect("valid toolbox");
/// McpServer::new(toolbox).with_tenant("acme-corp").serve_stdio().await
/// # }
/// ```
// The module is gated on `mcp` already; rustdoc reads only an item's own cfg across crates,
// so without it here `toolkey`'s docs would not mark the type.
#[cfg(feature = "mcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp")))]
pub struct McpServer {
    toolbox: Toolbox,
    tenant: Option<String>,
    info: Implementation,
    instructions: Option<String>,
    client_run_ids: ClientRunIds,
    session_run_id: Mutex<Option<Arc<str>>>,
    /// How long a keyed call runs before it continues as a task; `None`: never.
    task_after: Option<Duration>,
    /// Over HTTP: every request carries the [`Principal`](super::http::Principal) its
    /// credentials proved, which fixes the tenant and scopes client-named run ids.
    #[cfg(feature = "mcp-http")]
    authenticated: bool,
    /// Over HTTP: the scopes each tool requires of the request's principal.
    #[cfg(feature = "mcp-http")]
    required_scopes: Arc<super::http::RequiredScopes>,
}

impl McpServer {
    /// A server for the toolbox, named `toolkey` to clients.
    pub fn new(toolbox: Toolbox) -> Self {
        McpServer {
            toolbox,
            tenant: None,
            info: Implementation::new("toolkey", env!("CARGO_PKG_VERSION")),
            instructions: None,
            client_run_ids: ClientRunIds::Refused,
            session_run_id: Mutex::new(None),
            task_after: Some(tasks::DEFAULT_TASK_AFTER),
            #[cfg(feature = "mcp-http")]
            authenticated: false,
            #[cfg(feature = "mcp-http")]
            required_scopes: Arc::default(),
        }
    }

    /// A server for one HTTP session: the same toolbox and settings, its own session, every
    /// call's tenant and run scope from the request's principal, each tool listed to and run for
    /// a principal granted the scopes it requires.
    #[cfg(feature = "mcp-http")]
    pub(super) fn authenticated_session(
        &self,
        required_scopes: Arc<super::http::RequiredScopes>,
    ) -> Self {
        McpServer {
            toolbox: self.toolbox.clone(),
            tenant: None,
            info: self.info.clone(),
            instructions: self.instructions.clone(),
            client_run_ids: ClientRunIds::Refused,
            session_run_id: Mutex::new(None),
            task_after: self.task_after,
            authenticated: true,
            required_scopes,
        }
    }

    #[cfg(feature = "mcp-http")]
    pub(super) fn toolbox(&self) -> &Toolbox {
        &self.toolbox
    }

    /// The tenant every call runs for (`ctx.tenant`); none when not set.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Accepts the run ids and event ids clients name in a request's `_meta`, scoped to the
    /// client as `policy` says; refused when not set. See [Run ids](super#run-ids).
    ///
    /// ```no_run
    /// use toolkey::providers::mcp::{ClientRunIds, McpServer};
    /// # fn build(toolbox: toolkey::Toolbox, user: String) -> McpServer {
    /// // A stdio server started for one signed-in user: their runs resume across connections.
    /// McpServer::new(toolbox).with_client_run_ids(ClientRunIds::Principal(user))
    /// # }
    /// ```
    pub fn with_client_run_ids(mut self, policy: ClientRunIds) -> Self {
        self.client_run_ids = policy;
        self
    }

    /// How long a keyed call of a client that accepts tasks runs before it continues as an MCP
    /// task (10 s when not set); `None` offers no tasks, and every client waits for its result
    /// or `TIMEOUT` as before. A tool's own `timeout` also turns its call into a task, when it
    /// is shorter. See [Tasks](super#tasks).
    pub fn with_tasks_after(mut self, after: Option<Duration>) -> Self {
        self.task_after = after;
        self
    }

    /// The name and version the server gives clients at `initialize`.
    pub fn with_server_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.info = Implementation::new(name, version);
        self
    }

    /// Instructions for the model, sent to clients at `initialize`.
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Serves the toolbox on stdin and stdout until the client disconnects, then waits for tool
    /// bodies still running (see [`Toolbox::shutdown`]).
    ///
    /// Stdout carries the protocol: the program must write nothing else there.
    pub async fn serve_stdio(self) -> std::io::Result<()> {
        let toolbox = self.toolbox.clone();
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(std::io::Error::other)?;
        let quit = running.waiting().await.map_err(std::io::Error::other);
        // Each write the store did not take is logged by the shutdown itself.
        let _ = toolbox.shutdown().await;
        quit.map(drop)
    }

    /// The tenant of a call and the policy for the run ids it names: the server's, or over HTTP
    /// those of the request's principal.
    fn call_scope(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(Option<String>, ClientRunIds), ErrorData> {
        #[cfg(feature = "mcp-http")]
        if self.authenticated {
            return principal_scope(context);
        }
        let _ = context;
        Ok((self.tenant.clone(), self.client_run_ids.clone()))
    }

    /// Whether the request's principal was granted every scope `tool` requires; always over
    /// stdio.
    fn may_call(&self, tool: &str, context: &RequestContext<RoleServer>) -> bool {
        #[cfg(feature = "mcp-http")]
        if self.authenticated {
            return principal(context)
                .is_some_and(|principal| self.required_scopes.missing(tool, principal).is_empty());
        }
        let _ = (tool, context);
        true
    }

    /// Whose tasks a request's calls make and finds: its principal's, or its session's; no
    /// one's on a request with neither, which then gets no task.
    fn task_owner(client_run_ids: &ClientRunIds, session: Option<&str>) -> Option<Owner> {
        match client_run_ids {
            ClientRunIds::Principal(principal) => Some(Owner::principal(principal)),
            _ => session.map(Owner::session),
        }
    }

    /// The tenant and owner whose task a `tasks/*` request names.
    fn task_scope(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(String, Owner), ErrorData> {
        let (tenant, client_run_ids) = self.call_scope(context)?;
        let session = self.session_run(context);
        let owner = Self::task_owner(&client_run_ids, session.as_deref())
            .ok_or_else(|| ErrorData::invalid_params(texts::TASK_NOT_FOUND, None))?;
        Ok((tenant.unwrap_or_default(), owner))
    }

    /// Starts the session's run, at `initialize`.
    fn start_run(&self) {
        let mut session = self
            .session_run_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *session = Some(Arc::from(format!("mcp-{}", uuid::Uuid::new_v4())));
    }

    /// The session's run: made at `initialize`, or at the first call of a client that skips it
    /// on a connection of its own (stdio). `None` for an HTTP request outside a session: rmcp
    /// serves each with a fresh server, so a run made here would be made again for its retry.
    fn session_run(&self, context: &RequestContext<RoleServer>) -> Option<Arc<str>> {
        let mut session = self
            .session_run_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if session.is_none() && context.extensions.get::<http::request::Parts>().is_none() {
            *session = Some(Arc::from(format!("mcp-{}", uuid::Uuid::new_v4())));
        }
        session.clone()
    }
}

fn internal(message: String) -> ErrorData {
    ErrorData::internal_error(message, None)
}

/// The principal the authentication layer put on an HTTP request; `None` over stdio.
#[cfg(feature = "mcp-http")]
fn principal(context: &RequestContext<RoleServer>) -> Option<&super::http::Principal> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<super::http::Principal>())
}

/// The tenant and the run-id policy of one call over HTTP, from the principal the
/// authentication layer put on the request; an error, and nothing runs, without one.
#[cfg(feature = "mcp-http")]
fn principal_scope(
    context: &RequestContext<RoleServer>,
) -> Result<(Option<String>, ClientRunIds), ErrorData> {
    let principal = principal(context).ok_or_else(|| {
        // Only a router assembled without toolkey's authentication layer gets here.
        ErrorData::invalid_request("the request is not authenticated", None)
    })?;
    Ok((
        Some(principal.tenant().to_string()),
        ClientRunIds::Principal(principal.id().to_string()),
    ))
}

/// How long a body's `ctx.progress(..)` waits for its notification to be taken.
/// How long a client may keep a `tools/list` answer before asking again: a minute, so that a
/// new release's tools reach clients soon after it starts.
const TOOL_LIST_TTL_MS: u64 = 60_000;

const PROGRESS_SEND_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a request is still unanswered; answered once this is dropped.
struct Unanswered(Arc<AtomicBool>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `ctx.progress(..)` as `notifications/progress` to the client, when its request asked for
/// them with a `progressToken`, until the request is answered (the guard returned is dropped):
/// a body that goes on after a `TIMEOUT`, or as a task, reports to no one (the Tasks extension
/// has no progress for tasks).
fn with_progress(
    ctx: ToolContext,
    context: &RequestContext<RoleServer>,
) -> (ToolContext, Unanswered) {
    let open = Arc::new(AtomicBool::new(true));
    let guard = Unanswered(open.clone());
    let Some(token) = context.meta.get_progress_token() else {
        return (ctx, guard);
    };
    let peer = context.peer.clone();
    let ctx = ctx.with_progress(Arc::new(move |done, total, message| {
        let peer = peer.clone();
        let mut param = ProgressNotificationParam::new(token.clone(), done);
        param.total = total;
        param.message = message;
        let open = open.clone();
        Box::pin(async move {
            if !open.load(Ordering::Acquire) {
                return;
            }
            // A client that went away, or reads too slowly, misses its progress: the body goes on.
            let sent = tokio::time::timeout(PROGRESS_SEND_LIMIT, peer.notify_progress(param));
            match sent.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "toolkey: a progress notification was not sent")
                }
                Err(_) => tracing::debug!("toolkey: a progress notification was dropped"),
            }
        })
    }));
    (ctx, guard)
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let tools = ServerCapabilities::builder().enable_tools();
        let capabilities = match self.task_after {
            Some(_) => tools.enable_tasks().build(),
            None => tools.build(),
        };
        let config = ServerConfig::new(capabilities).with_server_info(self.info.clone());
        match &self.instructions {
            Some(instructions) => config.with_instructions(instructions.clone()),
            None => config,
        }
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.call_scope(&context)?;
        context.peer.set_peer_info(request.clone());
        self.start_run();
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .toolbox
            .definitions()
            .iter()
            .filter(|def| self.may_call(&def.name, &context))
            .map(|def| serde_json::from_value::<Tool>(def.to_mcp()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| internal(format!("a tool definition is not a valid MCP tool: {e}")))?;
        // The 2026-07-28 protocol asks every list for how long it stays fresh and who may cache
        // it. A toolbox's tools are fixed for its life, but a new release may change them; and
        // what one caller is shown is that caller's own (a server may list tools per principal).
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(TOOL_LIST_TTL_MS)
            .with_cache_scope(CacheScope::Private))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        serde_json::from_value(self.toolbox.definition(name)?.to_mcp()).ok()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (tenant, client_run_ids) = self.call_scope(&context)?;
        if !self.may_call(&request.name, &context) {
            // The HTTP layer answers such a call `403` first; this holds behind any other.
            return Err(ErrorData::invalid_request(
                format!(
                    "calling `{}` needs a scope this token does not grant",
                    request.name
                ),
                None,
            ));
        }
        let session = self.session_run(&context);
        let meta: &Map<String, Value> = &context.meta;
        // rmcp refuses a task to a client that did not declare the extension on this request
        // (or, in a session, at `initialize`): such a client waits, as before. So does one
        // nobody could find its task for.
        let owner = Self::task_owner(&client_run_ids, session.as_deref());
        let accepts_tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        let tool = Some((&self.toolbox, request.name.as_ref()));
        let reply = match call_context(Some(meta), session.as_deref(), &client_run_ids, tool) {
            Ok(ctx) => {
                let ctx = match tenant {
                    Some(tenant) => ctx.with_tenant(tenant),
                    None => ctx,
                };
                let (ctx, _unanswered) = with_progress(ctx, &context);
                let ctx = ctx.with_mcp_request_id(context.id.to_string());
                match (self.task_after.filter(|_| accepts_tasks), owner) {
                    (Some(after), Some(owner)) => {
                        let arguments = request.arguments.map(Value::Object);
                        let answer = tasks::call(
                            &self.toolbox,
                            &request.name,
                            arguments.as_ref(),
                            &ctx,
                            &owner,
                            after,
                        );
                        match answer.await {
                            Answer::Task(task) => return Ok(CallToolResponse::Task(task)),
                            Answer::Done(result) => call_tool_result(&result),
                        }
                    }
                    _ => {
                        let params = serde_json::json!({"name": request.name, "arguments": request.arguments});
                        handle_tools_call(&self.toolbox, &params, &ctx).await
                    }
                }
            }
            Err(err) => call_tool_result(&Err(err)),
        };
        let mut result: CallToolResult = serde_json::from_value::<CallToolResult>(reply)
            .map_err(|e| internal(format!("a tool result is not a valid MCP result: {e}")))?;
        // Required from 2026-07-28 on; rmcp strips it again for a client on an older version.
        result.result_type = Some(ResultType::COMPLETE);
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        // rmcp answers `tasks/*` for a server that offers tasks only.
        let after = self.task_after.unwrap_or(tasks::DEFAULT_TASK_AFTER);
        let (tenant, owner) = self.task_scope(&context)?;
        tasks::get(&self.toolbox, &tenant, &owner, &request.task_id, after).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (tenant, owner) = self.task_scope(&context)?;
        tasks::check(&self.toolbox, &tenant, &owner, &request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (tenant, owner) = self.task_scope(&context)?;
        tasks::check(&self.toolbox, &tenant, &owner, &request.task_id).await
    }
}
