//! The MCP server: a toolbox behind rmcp's `ServerHandler`.

use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};

use super::{call_tool_result, context_from_meta, handle_tools_call, ClientRunIds};
use crate::Toolbox;

/// A toolbox served over MCP: `tools/list` from its definitions (annotations included),
/// `tools/call` through [`Toolbox::call`], so keys, replays, `IN_PROGRESS` and `CONFLICT` hold
/// over MCP as they do in process.
///
/// It implements rmcp's [`ServerHandler`], so it can be served on any rmcp transport;
/// [`serve_stdio`](Self::serve_stdio) serves it on stdin and stdout. See the
/// [module docs](super#run-ids) for where the run id of a call comes from.
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
pub struct McpServer {
    toolbox: Toolbox,
    tenant: Option<String>,
    info: Implementation,
    instructions: Option<String>,
    client_run_ids: ClientRunIds,
    session_run_id: Mutex<Option<Arc<str>>>,
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
        }
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

    /// The session's run id: made at `initialize`, or at the first call of a client that skips it.
    fn run_id(&self, fresh: bool) -> Arc<str> {
        let mut session = self
            .session_run_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if fresh || session.is_none() {
            *session = Some(Arc::from(format!("mcp-{}", uuid::Uuid::new_v4())));
        }
        session.clone().expect("set above")
    }
}

fn internal(message: String) -> ErrorData {
    ErrorData::internal_error(message, None)
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(self.info.clone());
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
        context.peer.set_peer_info(request.clone());
        self.run_id(true);
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .toolbox
            .definitions()
            .iter()
            .map(|def| serde_json::from_value::<Tool>(def.to_mcp()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| internal(format!("a tool definition is not a valid MCP tool: {e}")))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        serde_json::from_value(self.toolbox.definition(name)?.to_mcp()).ok()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let run_id = self.run_id(false);
        let meta: &Map<String, Value> = &context.meta;
        let reply = match context_from_meta(Some(meta), &run_id, &self.client_run_ids) {
            Ok(ctx) => {
                let ctx = match &self.tenant {
                    Some(tenant) => ctx.with_tenant(tenant.clone()),
                    None => ctx,
                };
                let params =
                    serde_json::json!({"name": request.name, "arguments": request.arguments});
                handle_tools_call(&self.toolbox, &params, &ctx).await
            }
            Err(err) => call_tool_result(&Err(err)),
        };
        let result: CallToolResult = serde_json::from_value::<CallToolResult>(reply)
            .map_err(|e| internal(format!("a tool result is not a valid MCP result: {e}")))?;
        Ok(result.into())
    }
}
