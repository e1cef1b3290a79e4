//! The OAuth 2.1 resource server around the endpoint: its Protected Resource Metadata (RFC
//! 9728), the `WWW-Authenticate` challenges of RFC 6750 §3, and the scopes each tool requires.

use std::collections::{BTreeSet, HashMap};

use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

use super::Principal;

/// Where RFC 9728 puts a protected resource's metadata, before the resource's own path.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The largest request body the scope check reads: rmcp's own limit for a POST.
pub(super) const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What the endpoint tells OAuth clients about itself, as RFC 9728's Protected Resource
/// Metadata: its canonical URI (the audience its tokens must be issued for) and the
/// authorization servers that issue them. Set on [`McpHttp::with_protected_resource`].
///
/// ```
/// use toolkey::providers::mcp::http::ProtectedResource;
///
/// let resource = ProtectedResource::new("https://mcp.example.com/mcp")?
///     .with_authorization_server("https://auth.example.com");
/// assert_eq!(
///     resource.metadata_url(),
///     "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
/// );
/// # Ok::<(), toolkey::providers::mcp::http::ConfigError>(())
/// ```
///
/// [`McpHttp::with_protected_resource`]: super::McpHttp::with_protected_resource
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedResource {
    resource: String,
    /// The resource's path, without a trailing slash: `/mcp`, or empty.
    path: String,
    metadata_url: String,
    authorization_servers: Vec<String>,
    scopes_supported: Vec<String>,
}

impl ProtectedResource {
    /// The resource at `resource`, its canonical URI as clients reach it
    /// (`https://mcp.example.com/mcp`: scheme, host, port when not the default, path; no query,
    /// no fragment). An error when it is not such a URI.
    pub fn new(resource: impl Into<String>) -> Result<Self, ConfigError> {
        let resource = resource.into();
        let invalid = || ConfigError::InvalidResource(resource.clone());
        if resource.contains(['#', '?', '"', '\\']) || resource.chars().any(char::is_whitespace) {
            return Err(invalid());
        }
        let uri: http::Uri = resource.parse().map_err(|_| invalid())?;
        let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
        let (Some(scheme @ ("https" | "http")), Some(authority)) =
            (scheme.as_deref(), uri.authority())
        else {
            return Err(invalid());
        };
        let path = uri.path().trim_end_matches('/').to_string();
        let metadata_url = format!(
            "{scheme}://{}{WELL_KNOWN}{path}",
            authority.as_str().to_ascii_lowercase()
        );
        Ok(ProtectedResource {
            resource,
            path,
            metadata_url,
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
        })
    }

    /// An authorization server (its issuer identifier, `https://auth.example.com`) whose
    /// tokens the endpoint accepts; clients discover it in the metadata, and MCP clients need
    /// at least one.
    pub fn with_authorization_server(mut self, issuer: impl Into<String>) -> Self {
        self.authorization_servers.push(issuer.into());
        self
    }

    /// Scopes to advertise in the metadata beside those tools
    /// [require](super::McpHttp::require_scopes), which are always listed.
    pub fn with_scopes_supported(
        mut self,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.scopes_supported
            .extend(scopes.into_iter().map(Into::into));
        self
    }

    /// The canonical URI: the audience a token must be issued for.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Where the metadata is served, as the `resource_metadata` of every challenge names it:
    /// `/.well-known/oauth-protected-resource` inserted before the resource's path.
    pub fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The metadata document, every scope in `required` listed as supported.
    fn document(&self, required: &RequiredScopes) -> Value {
        let scopes: BTreeSet<&str> = self
            .scopes_supported
            .iter()
            .map(String::as_str)
            .chain(required.all())
            .collect();
        let mut document = serde_json::json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
        });
        if !scopes.is_empty() {
            document["scopes_supported"] = serde_json::json!(scopes);
        }
        document
    }

    /// The metadata at RFC 9728's path for this resource, and at the host's root form too, for
    /// clients that look there first.
    pub(super) fn router(&self, required: &RequiredScopes) -> Router {
        let body = self.document(required).to_string();
        let serve = move || {
            let body = body.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    body,
                )
            }
        };
        let router = Router::new().route(WELL_KNOWN, get(serve.clone()));
        if self.path.is_empty() {
            router
        } else {
            router.route(&format!("{WELL_KNOWN}{}", self.path), get(serve))
        }
    }
}

/// A setting of the OAuth resource server that cannot work, named when it is made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The resource URI is not an absolute `https://` or `http://` URI without query or
    /// fragment.
    #[error("`{0}` is not a resource URI: give the endpoint's absolute URI, such as `https://mcp.example.com/mcp`, without query or fragment")]
    InvalidResource(String),
    /// Scopes were required for a tool the toolbox does not have.
    #[error("scopes are required for `{0}`, which is not a tool of this toolbox")]
    UnknownTool(String),
    /// A scope is empty, or has a character OAuth does not allow in one (a space, `"`, `\`,
    /// a control character, anything outside ASCII).
    #[error(
        "`{0}` is not an OAuth scope: a scope is printable ASCII, without spaces, `\"` or `\\`"
    )]
    InvalidScope(String),
    /// An issuer or JWKS URI is not an absolute `https://` or `http://` URI.
    #[error("`{0}` is not an absolute `https://` or `http://` URI")]
    InvalidUri(String),
    /// The HTTP client that fetches an issuer's keys could not be made (its TLS settings).
    #[error("the HTTP client for the issuer's keys could not be made: {0}")]
    HttpClient(String),
}

/// The scopes each tool requires; a tool not named requires none, unless it is the status
/// companion of one that does.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequiredScopes {
    named: HashMap<String, Vec<String>>,
    /// Status companions, each with the tool it tells about: a companion given no scopes of
    /// its own requires that tool's, since it answers what the tool did and returned.
    companions: HashMap<String, String>,
}

impl RequiredScopes {
    /// Requires `scopes` of `tool`'s callers, beside those already required.
    pub(super) fn add(
        &mut self,
        tool: &str,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<(), ConfigError> {
        let scopes: Vec<String> = scopes.into_iter().map(Into::into).collect();
        if let Some(bad) = scopes.iter().find(|scope| !is_scope(scope)) {
            return Err(ConfigError::InvalidScope(bad.clone()));
        }
        let required = self.named.entry(tool.to_string()).or_default();
        for scope in scopes {
            if !required.contains(&scope) {
                required.push(scope);
            }
        }
        Ok(())
    }

    /// `companion` tells about `tool`: without scopes of its own, it requires `tool`'s.
    pub(super) fn companion(&mut self, companion: &str, tool: &str) {
        self.companions
            .insert(companion.to_string(), tool.to_string());
    }

    pub(super) fn is_empty(&self) -> bool {
        self.named.is_empty()
    }

    fn all(&self) -> impl Iterator<Item = &str> {
        self.named.values().flatten().map(String::as_str)
    }

    /// What `tool` requires: its own scopes, or those of the tool it is the companion of.
    fn of(&self, tool: &str) -> Option<&[String]> {
        let own = self.named.get(tool);
        let told = || self.named.get(self.companions.get(tool)?);
        own.or_else(told).map(Vec::as_slice)
    }

    /// The scopes `tool` requires that `principal` was not granted; empty when it may call it.
    pub(crate) fn missing(&self, tool: &str, principal: &Principal) -> Vec<&str> {
        self.of(tool).map_or_else(Vec::new, |required| {
            required
                .iter()
                .filter(|scope| !principal.has_scope(scope))
                .map(String::as_str)
                .collect()
        })
    }

    /// The first tool a JSON-RPC body calls (`tools/call`, alone or in a batch) whose scopes
    /// `principal` lacks, with the scopes it requires. A body that is not JSON is left to the
    /// MCP layer, which refuses it.
    pub(super) fn refused_call<'a>(
        &'a self,
        body: &[u8],
        principal: &Principal,
    ) -> Option<(String, &'a [String])> {
        let message: Value = serde_json::from_slice(body).ok()?;
        let messages = match &message {
            Value::Array(batch) => batch.iter().collect(),
            single => vec![single],
        };
        messages.into_iter().find_map(|message| {
            if message.get("method").and_then(Value::as_str) != Some("tools/call") {
                return None;
            }
            let tool = message.pointer("/params/name").and_then(Value::as_str)?;
            let required = self.of(tool)?;
            (!self.missing(tool, principal).is_empty()).then(|| (tool.to_string(), required))
        })
    }
}

/// RFC 6749's scope token: `%x21 / %x23-5B / %x5D-7E`, at least one.
fn is_scope(scope: &str) -> bool {
    !scope.is_empty()
        && scope
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
}

/// A `WWW-Authenticate: Bearer` challenge with `params` in order, each value a quoted string.
/// A value's characters a quoted string cannot hold as they are (`"`, `\`, controls, non-ASCII)
/// become `?`, as RFC 6750 allows none of them in an `error_description`.
pub(super) fn challenge(params: &[(&str, &str)]) -> HeaderValue {
    let mut value = String::from("Bearer");
    for (i, (name, param)) in params.iter().enumerate() {
        value.push_str(if i == 0 { " " } else { ", " });
        let quoted: String = param
            .chars()
            .map(|c| match c {
                ' ' | '!' | '#'..='[' | ']'..='~' => c,
                _ => '?',
            })
            .collect();
        value.push_str(&format!("{name}=\"{quoted}\""));
    }
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

/// The answer to a call of `tool` by a principal lacking some of the `required` scopes: `403
/// Forbidden`, the challenge naming the scopes, and the tool never runs.
pub(super) fn insufficient_scope(
    tool: &str,
    required: &[String],
    resource: Option<&ProtectedResource>,
) -> Response {
    let scope = required.join(" ");
    let message = format!(
        "calling `{tool}` needs the scope `{scope}`, which this token does not grant: ask the authorization server for a token with it"
    );
    let mut params = vec![("error", "insufficient_scope"), ("scope", scope.as_str())];
    if let Some(resource) = resource {
        params.push(("resource_metadata", resource.metadata_url()));
    }
    params.push(("error_description", message.as_str()));
    let body = serde_json::json!({"error": {"code": "INSUFFICIENT_SCOPE", "message": message}});
    let mut response = (
        StatusCode::FORBIDDEN,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, challenge(&params));
    response
}

/// The answer to a request whose body could not be read in full, or is larger than the MCP
/// layer takes.
pub(super) fn unreadable_body() -> Response {
    let body = serde_json::json!({"error": {"code": "BAD_REQUEST",
        "message": "the request body could not be read, or is larger than 4 MiB"}});
    (
        StatusCode::BAD_REQUEST,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}
