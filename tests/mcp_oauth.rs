//! MCP over HTTP as an OAuth 2.1 resource server, end to end against a local authorization
//! server served by the test (its metadata, a JWKS, a token endpoint minting tokens for the
//! resource a client names): a client discovers the metadata from the `401`, gets a token for
//! this resource and calls; tokens for another audience, expired, not yet valid, signed by an
//! unknown key, from another issuer, or without the tool's scope are refused with the status
//! and `WWW-Authenticate` header the specs give, and nothing runs. Every scenario ends with an
//! exact count of charges on a fake ledger.
#![cfg(feature = "mcp-oauth")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State as AxumState;
use axum::routing::{get, post};
use axum::{Json, Router};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolkey::providers::mcp::http::{
    bearer_token, ConfigError, McpHttp, Parts, Principal, ProtectedResource, Refusal,
};
use toolkey::providers::mcp::oauth::{JwtAuthenticator, JwtAuthenticatorBuilder};
use toolkey::{tool, State, ToolContext, ToolError, Toolbox};

// ---- the outside system and its tools ---------------------------------------------------------

/// A fake payment system: every charge it made, with the tenant it was made for.
#[derive(Default)]
struct Ledger {
    charges: Mutex<Vec<Payment>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Payment {
    order: String,
    tenant: String,
}

/// Charge an order.
#[tool(idempotent(key = "charge:<order>", status = false))]
async fn charge(
    ledger: State<Ledger>,
    ctx: &ToolContext,
    /// The order to charge.
    order: String,
) -> Result<Payment, ToolError> {
    let payment = Payment {
        order,
        tenant: ctx.tenant().unwrap_or_default().to_string(),
    };
    ledger.charges.lock().unwrap().push(payment.clone());
    Ok(payment)
}

/// How many charges were made.
#[tool(read_only)]
async fn count_charges(ledger: State<Ledger>) -> Result<usize, ToolError> {
    Ok(ledger.charges.lock().unwrap().len())
}

/// Refund an order's charge.
#[tool(idempotent(key = "refund:<order>", status = "refund_status"))]
async fn refund(
    ledger: State<Ledger>,
    /// The order to refund.
    order: String,
) -> Result<Payment, ToolError> {
    let mut charges = ledger.charges.lock().unwrap();
    let at = charges.iter().position(|payment| payment.order == order);
    let refunded = at.map(|at| charges.remove(at));
    refunded.ok_or_else(|| ToolError::new("NOT_CHARGED", "no charge of this order to refund"))
}

fn toolbox(ledger: &Arc<Ledger>) -> Toolbox {
    Toolbox::builder()
        .shared_state(ledger.clone())
        .tool(Charge)
        .tool(CountCharges)
        .build()
        .expect("a valid toolbox")
}

// ---- the authorization server -----------------------------------------------------------------

/// A signing key of the test's own, by the name its `kid` carries.
fn key(name: &str) -> EncodingKey {
    let pem = match name {
        "key-1" => include_str!("mcp_oauth/issuer-key-1.pem"),
        "key-2" => include_str!("mcp_oauth/issuer-key-2.pem"),
        "stranger" => include_str!("mcp_oauth/stranger-key.pem"),
        other => panic!("no key {other}"),
    };
    EncodingKey::from_ec_pem(pem.as_bytes()).expect("a P-256 key")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A JWT of `claims`, signed ES256 with the key `kid` names, under the `kid` `kid`.
fn sign(signer: &str, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, &key(signer)).expect("a signed token")
}

/// A local authorization server: its metadata, its JWKS (the keys it publishes now, and how
/// often it was fetched), and a token endpoint.
struct Issuer {
    url: String,
    state: Arc<IssuerState>,
}

struct IssuerState {
    url: String,
    published: Mutex<Vec<&'static str>>,
    jwks_fetches: AtomicUsize,
}

impl Issuer {
    async fn start() -> Issuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(IssuerState {
            url: url.clone(),
            published: Mutex::new(vec!["key-1"]),
            jwks_fetches: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/.well-known/oauth-authorization-server", get(metadata))
            .route("/jwks", get(jwks))
            .route("/token", post(token))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Issuer { url, state }
    }

    fn publish(&self, keys: &[&'static str]) {
        *self.state.published.lock().unwrap() = keys.to_vec();
    }

    fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// Claims as this issuer writes them: for `audience`, valid for five minutes.
    fn claims(&self, audience: &str, scope: &str) -> Value {
        json!({"iss": self.url, "sub": "client-7", "aud": audience, "scope": scope,
               "iat": now(), "exp": now() + 300, "org": "acme"})
    }
}

async fn metadata(AxumState(state): AxumState<Arc<IssuerState>>) -> Json<Value> {
    Json(json!({
        "issuer": state.url,
        "jwks_uri": format!("{}/jwks", state.url),
        "token_endpoint": format!("{}/token", state.url),
        "grant_types_supported": ["client_credentials"],
    }))
}

async fn jwks(AxumState(state): AxumState<Arc<IssuerState>>) -> Json<JwkSet> {
    state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    let keys = state.published.lock().unwrap().clone();
    let keys = keys
        .into_iter()
        .map(|kid| {
            let mut jwk = Jwk::from_encoding_key(&key(kid), Algorithm::ES256).unwrap();
            jwk.common.key_id = Some(kid.to_string());
            jwk
        })
        .collect();
    Json(JwkSet { keys })
}

/// The client credentials grant, form-encoded: a token for the `resource` the client names,
/// with the `scope` it asks for, signed with the newest key published.
async fn token(AxumState(state): AxumState<Arc<IssuerState>>, body: String) -> Json<Value> {
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
    assert_eq!(form["grant_type"], "client_credentials");
    let kid = *state.published.lock().unwrap().last().unwrap();
    let claims = json!({"iss": state.url, "sub": form["client_id"], "aud": form["resource"],
        "scope": form["scope"], "iat": now(), "exp": now() + 300, "org": "acme"});
    Json(
        json!({"access_token": sign(kid, kid, &claims), "token_type": "Bearer",
                "expires_in": 300, "scope": form["scope"]}),
    )
}

// ---- the MCP server ---------------------------------------------------------------------------

struct Server {
    url: String,
    metadata_url: String,
    ledger: Arc<Ledger>,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// A resource server for `issuer`'s tokens, `charge` requiring `payments:write`, the JWKS
    /// fetched again for an unknown key after `refetch`.
    async fn start(issuer: &Issuer, refetch: Duration) -> Server {
        Server::start_with(issuer, |tokens| tokens.jwks_refetch_interval(refetch)).await
    }

    /// [`Server::start`], the authenticator configured by `configure`.
    async fn start_with(
        issuer: &Issuer,
        configure: impl FnOnce(JwtAuthenticatorBuilder) -> JwtAuthenticatorBuilder,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let tokens = configure(JwtAuthenticator::builder(&issuer.url, &url).tenant_claim("org"))
            .build()
            .expect("a valid authenticator");
        let resource = ProtectedResource::new(&url)
            .unwrap()
            .with_authorization_server(&issuer.url);
        let metadata_url = resource.metadata_url().to_string();
        let ledger = Arc::new(Ledger::default());
        let mcp = McpHttp::new(toolbox(&ledger), tokens)
            .with_protected_resource(resource)
            .require_scopes("charge", ["payments:write"])
            .unwrap();
        Server::serve(listener, url, metadata_url, ledger, mcp)
    }

    fn serve(
        listener: tokio::net::TcpListener,
        url: String,
        metadata_url: String,
        ledger: Arc<Ledger>,
        mcp: McpHttp,
    ) -> Server {
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(mcp.serve(listener, async {
            let _ = stopped.await;
        }));
        Server {
            url,
            metadata_url,
            ledger,
            stop,
            served,
        }
    }

    /// Stops the server; the charges it made.
    async fn stop(self) -> Vec<Payment> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.served)
            .await
            .expect("the server stops in time")
            .unwrap()
            .unwrap();
        let charges = self.ledger.charges.lock().unwrap().clone();
        charges
    }

    fn invalid_token(&self, description: &str) -> String {
        format!(
            "Bearer error=\"invalid_token\", resource_metadata=\"{}\", error_description=\"{description}\"",
            self.metadata_url
        )
    }
}

/// A 2026-07-28 `tools/call` of `charge` for `order`, in no session, with `token` when given:
/// the HTTP status, the `WWW-Authenticate` header, and the body.
async fn call(url: &str, token: Option<&str>, order: &str) -> (u16, String, String) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "charge", "arguments": {"order": order}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}});
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "charge");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, challenge, response.text().await.unwrap_or_default())
}

type Client = RunningService<RoleClient, ()>;

async fn rmcp_client(url: &str, token: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    ().serve(transport).await.expect("the client connects")
}

async fn tool_names(client: &Client) -> Vec<String> {
    let tools = client.list_all_tools().await.expect("tools/list succeeds");
    tools
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect()
}

async fn rmcp_charge(client: &Client, order: &str) -> Value {
    let params = CallToolRequestParams::new("charge")
        .with_arguments(json!({"order": order}).as_object().unwrap().clone());
    let result = client.call_tool(params).await.expect("tools/call succeeds");
    serde_json::to_value(result).unwrap()
}

/// The parameter `name` of a `WWW-Authenticate` challenge.
fn param(challenge: &str, name: &str) -> String {
    let start = challenge
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {challenge}"))
        + name.len()
        + 2;
    let end = start + challenge[start..].find('"').unwrap();
    challenge[start..end].to_string()
}

// ---- the scenarios ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_discovers_the_issuer_from_the_401_gets_a_token_and_calls() {
    let issuer = Issuer::start().await;
    let server = Server::start(&issuer, Duration::ZERO).await;
    let http = reqwest::Client::new();

    // No token: 401, and the challenge names the metadata, with no error (RFC 6750 §3.1).
    let (status, challenge, _) = call(&server.url, None, "order-1").await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{}\"", server.metadata_url)
    );
    let metadata: Value = http
        .get(param(&challenge, "resource_metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        metadata,
        json!({"resource": server.url, "authorization_servers": [issuer.url],
               "bearer_methods_supported": ["header"], "scopes_supported": ["payments:write"]})
    );
    // The root form of the well-known URI answers the same.
    let root = server
        .url
        .replace("/mcp", "/.well-known/oauth-protected-resource");
    let at_root: Value = http.get(root).send().await.unwrap().json().await.unwrap();
    assert_eq!(at_root, metadata);

    // The authorization server's metadata, then a token for this resource.
    let authorization_server = metadata["authorization_servers"][0].as_str().unwrap();
    let as_metadata: Value = http
        .get(format!(
            "{authorization_server}/.well-known/oauth-authorization-server"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let form = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "client_credentials")
        .append_pair("client_id", "agent-1")
        .append_pair("resource", metadata["resource"].as_str().unwrap())
        .append_pair("scope", "payments:write")
        .finish();
    let granted: Value = http
        .post(as_metadata["token_endpoint"].as_str().unwrap())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = granted["access_token"].as_str().unwrap();

    let client = rmcp_client(&server.url, token).await;
    assert_eq!(tool_names(&client).await, ["charge", "count_charges"]);
    let result = rmcp_charge(&client, "order-1").await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["structuredContent"],
        json!({"order": "order-1", "tenant": "acme"})
    );
    client.cancel().await.unwrap();
    assert_eq!(issuer.jwks_fetches(), 1);
    assert_eq!(
        server.stop().await,
        [Payment {
            order: "order-1".into(),
            tenant: "acme".into()
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_do_not_prove_a_caller_for_this_server_are_refused_and_nothing_runs() {
    let issuer = Issuer::start().await;
    let server = Server::start(&issuer, Duration::ZERO).await;
    let scope = "payments:write";
    let claims = || issuer.claims(&server.url, scope);
    let with = |change: Value| {
        let mut claims = claims();
        for (name, value) in change.as_object().unwrap() {
            match value {
                Value::Null => claims.as_object_mut().unwrap().remove(name),
                value => claims
                    .as_object_mut()
                    .unwrap()
                    .insert(name.clone(), value.clone()),
            };
        }
        claims
    };
    let refused = [
        (
            sign("key-1", "key-1", &with(json!({"aud": "http://other.example/mcp"}))),
            format!(
                "the token was not issued for this server: its audience is not `{}`",
                server.url
            ),
        ),
        (
            sign("key-1", "key-1", &with(json!({"exp": now() - 120}))),
            "the token has expired".to_string(),
        ),
        (
            sign("key-1", "key-1", &with(json!({"nbf": now() + 300}))),
            "the token is not valid yet: its `nbf` is still to come".to_string(),
        ),
        (
            sign("stranger", "stranger", &claims()),
            "the token is signed with a key the issuer does not publish".to_string(),
        ),
        (
            sign("stranger", "key-1", &claims()),
            "the token's signature does not verify".to_string(),
        ),
        (
            sign("key-1", "key-1", &with(json!({"iss": "http://127.0.0.1:1"}))),
            format!("the token was not issued by `{}`", issuer.url),
        ),
        (
            sign("key-1", "key-1", &with(json!({"org": null}))),
            "the token has no `org` claim naming its tenant".to_string(),
        ),
        (
            sign("key-1", "key-1", &with(json!({"exp": null}))),
            "the token has no `exp` claim".to_string(),
        ),
        (
            sign("key-1", "key-1", &with(json!({"sub": ""}))),
            "the token's `sub` claim is not a non-empty string".to_string(),
        ),
        (
            // A shared secret: were it accepted, anyone could sign with a published key.
            jsonwebtoken::encode(
                &Header::new(Algorithm::HS256),
                &claims(),
                &EncodingKey::from_secret(b"guessable").unwrap(),
            )
            .unwrap(),
            "the token is signed with HS256, which this server does not accept: it takes only tokens signed with a key its issuer publishes".to_string(),
        ),
        (
            "not-a-jwt".to_string(),
            "the bearer token is not a JWT".to_string(),
        ),
    ];
    for (token, description) in &refused {
        let (status, challenge, body) = call(&server.url, Some(token), "order-1").await;
        assert_eq!(status, 401, "{description}: {body}");
        assert_eq!(challenge, server.invalid_token(description));
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    }
    // The token of an unknown key made the server ask the issuer again (its refetch interval is
    // zero here), and the refreshed keys still lacked it.
    assert_eq!(issuer.jwks_fetches(), 2);

    // Within the clock skew allowance (60 s), an expired token still counts; the control case.
    let late = sign("key-1", "key-1", &with(json!({"exp": now() - 20})));
    let (status, _, body) = call(&server.url, Some(&late), "order-1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.stop().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_the_tools_scope_gets_403_naming_it_and_is_not_shown_the_tool() {
    let issuer = Issuer::start().await;
    let server = Server::start(&issuer, Duration::ZERO).await;
    let reader = sign(
        "key-1",
        "key-1",
        &issuer.claims(&server.url, "payments:read"),
    );

    let (status, challenge, body) = call(&server.url, Some(&reader), "order-1").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        challenge,
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"payments:write\", resource_metadata=\"{}\", \
             error_description=\"calling `charge` needs the scope `payments:write`, which this token does not grant: \
             ask the authorization server for a token with it\"",
            server.metadata_url
        )
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "INSUFFICIENT_SCOPE");

    // In a session too: the tool is not listed, its call is refused, the other tool still runs.
    let client = rmcp_client(&server.url, &reader).await;
    assert_eq!(tool_names(&client).await, ["count_charges"]);
    let params = CallToolRequestParams::new("charge")
        .with_arguments(json!({"order": "order-1"}).as_object().unwrap().clone());
    assert!(
        client.call_tool(params).await.is_err(),
        "the call is refused"
    );
    let count = client
        .call_tool(CallToolRequestParams::new("count_charges"))
        .await
        .expect("a tool needing no scope runs");
    assert_eq!(
        serde_json::to_value(count).unwrap()["content"][0]["text"],
        "0"
    );
    client.cancel().await.unwrap();
    assert_eq!(server.stop().await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_picked_up_and_the_refetch_is_rate_limited() {
    let issuer = Issuer::start().await;
    // Fetched again for an unknown key at once.
    let eager = Server::start(&issuer, Duration::ZERO).await;
    // At most once a minute.
    let patient = Server::start(&issuer, Duration::from_secs(60)).await;
    let claims = |server: &Server| issuer.claims(&server.url, "payments:write");

    let old = sign("key-1", "key-1", &claims(&eager));
    assert_eq!(call(&eager.url, Some(&old), "order-1").await.0, 200);
    let old = sign("key-1", "key-1", &claims(&patient));
    assert_eq!(call(&patient.url, Some(&old), "order-1").await.0, 200);
    assert_eq!(issuer.jwks_fetches(), 2);

    issuer.publish(&["key-1", "key-2"]);
    let new = sign("key-2", "key-2", &claims(&eager));
    assert_eq!(call(&eager.url, Some(&new), "order-2").await.0, 200);
    assert_eq!(issuer.jwks_fetches(), 3);
    // The patient server fetched a moment ago: it does not ask again, and refuses the new key
    // for now, however often it is shown.
    let new = sign("key-2", "key-2", &claims(&patient));
    for _ in 0..3 {
        let (status, challenge, _) = call(&patient.url, Some(&new), "order-2").await;
        assert_eq!(status, 401);
        assert_eq!(
            challenge,
            patient.invalid_token("the token is signed with a key the issuer does not publish")
        );
    }
    assert_eq!(issuer.jwks_fetches(), 3);
    assert_eq!(eager.stop().await.len(), 2);
    assert_eq!(patient.stop().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_key_stops_counting_once_the_kept_keys_are_too_old() {
    let issuer = Issuer::start().await;
    let server = Server::start_with(&issuer, |tokens| {
        tokens
            .jwks_max_age(Duration::ZERO)
            .jwks_refetch_interval(Duration::ZERO)
    })
    .await;
    let token = sign(
        "key-1",
        "key-1",
        &issuer.claims(&server.url, "payments:write"),
    );
    assert_eq!(call(&server.url, Some(&token), "order-1").await.0, 200);
    issuer.publish(&["key-2"]);
    let (status, challenge, _) = call(&server.url, Some(&token), "order-2").await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge,
        server.invalid_token("the token is signed with a key the issuer does not publish")
    );
    assert_eq!(issuer.jwks_fetches(), 2);
    assert_eq!(server.stop().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_fetched_answer_503_and_nothing_runs() {
    let issuer = Issuer::start().await;
    // A port nothing listens on: bound, then let go.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks = format!("http://{}/jwks", closed.local_addr().unwrap());
    drop(closed);
    let server = Server::start_with(&issuer, |tokens| tokens.jwks_uri(jwks)).await;
    let token = sign(
        "key-1",
        "key-1",
        &issuer.claims(&server.url, "payments:write"),
    );
    for _ in 0..2 {
        let (status, challenge, body) = call(&server.url, Some(&token), "order-1").await;
        assert_eq!((status, challenge.as_str()), (503, ""));
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "UNAVAILABLE");
    }
    assert_eq!(issuer.jwks_fetches(), 0);
    assert_eq!(server.stop().await.len(), 0);
}

/// Alice may charge, Bob may only read: scopes from an authenticator of the user's own.
fn own_authenticator(request: &Parts) -> Result<Principal, Refusal> {
    match bearer_token(request) {
        Some("alice-token") => Ok(Principal::new("alice").with_scopes(["payments:write"])),
        Some("bob-token") => Ok(Principal::new("bob").with_scopes(["payments:read"])),
        _ => Err(Refusal::unauthenticated("unknown token")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticator_of_the_users_own_grants_scopes_too() {
    let ledger = Arc::new(Ledger::default());
    let unknown = McpHttp::new(toolbox(&ledger), own_authenticator)
        .require_scopes("refund", ["payments:write"]);
    assert_eq!(
        unknown.err().map(|err| err.to_string()),
        Some("scopes are required for `refund`, which is not a tool of this toolbox".into())
    );
    let bad_scope = McpHttp::new(toolbox(&ledger), own_authenticator)
        .require_scopes("charge", ["payments write"]);
    assert!(matches!(bad_scope, Err(ConfigError::InvalidScope(s)) if s == "payments write"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let mcp = McpHttp::new(toolbox(&ledger), own_authenticator)
        .require_scopes("charge", ["payments:write"])
        .unwrap();
    let server = Server::serve(listener, url, String::new(), ledger, mcp);

    // No protected resource: the challenges name none, and a bad token's stays bare, as before.
    let (status, challenge, _) = call(&server.url, Some("mallory-token"), "order-1").await;
    assert_eq!((status, challenge.as_str()), (401, "Bearer"));
    let (status, challenge, _) = call(&server.url, Some("bob-token"), "order-1").await;
    assert_eq!(status, 403);
    assert_eq!(param(&challenge, "error"), "insufficient_scope");
    assert_eq!(param(&challenge, "scope"), "payments:write");
    assert!(!challenge.contains("resource_metadata"), "{challenge}");

    let bob = rmcp_client(&server.url, "bob-token").await;
    assert_eq!(tool_names(&bob).await, ["count_charges"]);
    bob.cancel().await.unwrap();
    let alice = rmcp_client(&server.url, "alice-token").await;
    assert_eq!(tool_names(&alice).await, ["charge", "count_charges"]);
    let result = rmcp_charge(&alice, "order-1").await;
    assert_eq!(result["isError"], false, "{result}");
    alice.cancel().await.unwrap();
    assert_eq!(server.stop().await.len(), 1);
}

/// A `refund_status` call of order-1 by `client`: its answer on the wire, or the client's error.
async fn refund_status(client: &Client) -> Result<Value, String> {
    let params = CallToolRequestParams::new("refund_status")
        .with_arguments(json!({"order": "order-1"}).as_object().unwrap().clone());
    match client.call_tool(params).await {
        Ok(result) => Ok(serde_json::to_value(result).unwrap()),
        Err(err) => Err(err.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_companion_requires_its_tools_scopes_unless_given_its_own() {
    let ledger = Arc::new(Ledger::default());
    let toolbox = || {
        Toolbox::builder()
            .shared_state(ledger.clone())
            .tool(Charge)
            .tool(Refund)
            .build()
            .expect("a valid toolbox")
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    // `refund_status` tells what `refund` did and returned: it is refund's to see.
    let mcp = McpHttp::new(toolbox(), own_authenticator)
        .require_scopes("refund", ["payments:write"])
        .unwrap();
    let inherited = Server::serve(listener, url, String::new(), ledger.clone(), mcp);
    let bob = rmcp_client(&inherited.url, "bob-token").await;
    assert_eq!(tool_names(&bob).await, ["charge"]);
    let refused = refund_status(&bob).await;
    assert!(refused.is_err(), "{refused:?}");
    bob.cancel().await.unwrap();
    let alice = rmcp_client(&inherited.url, "alice-token").await;
    assert_eq!(
        tool_names(&alice).await,
        ["charge", "refund_status", "refund"]
    );
    let answer = refund_status(&alice).await.unwrap();
    assert_eq!(
        answer["structuredContent"]["status"], "not_found",
        "{answer}"
    );
    alice.cancel().await.unwrap();
    inherited.stop().await;

    // Given scopes of its own, the companion requires those.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let mcp = McpHttp::new(toolbox(), own_authenticator)
        .require_scopes("refund", ["payments:write"])
        .unwrap()
        .require_scopes("refund_status", ["payments:read"])
        .unwrap();
    let own = Server::serve(listener, url, String::new(), ledger, mcp);
    let bob = rmcp_client(&own.url, "bob-token").await;
    assert_eq!(tool_names(&bob).await, ["charge", "refund_status"]);
    let answer = refund_status(&bob).await.unwrap();
    assert_eq!(
        answer["structuredContent"]["status"], "not_found",
        "{answer}"
    );
    bob.cancel().await.unwrap();
    assert_eq!(own.stop().await.len(), 0);
}

#[test]
fn a_resource_uri_must_be_absolute_without_query_or_fragment() {
    for bad in [
        "mcp.example.com",
        "https://mcp.example.com/mcp#frag",
        "https://mcp.example.com/mcp?x=1",
        "ftp://mcp.example.com",
        "/mcp",
    ] {
        assert_eq!(
            ProtectedResource::new(bad),
            Err(ConfigError::InvalidResource(bad.into()))
        );
    }
    let root = ProtectedResource::new("https://MCP.example.com").unwrap();
    assert_eq!(
        root.metadata_url(),
        "https://mcp.example.com/.well-known/oauth-protected-resource"
    );
    assert!(
        JwtAuthenticator::builder("auth.example.com", "https://mcp.example.com")
            .build()
            .is_err()
    );
}
