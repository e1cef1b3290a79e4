//! A ready [`Authenticator`] for OAuth 2.1 bearer tokens that are JWTs (feature `mcp-oauth`):
//! [`JwtAuthenticator`] checks each token against its issuer's published keys, and names the
//! caller from it.
//!
//! A token is let in when all of these hold, and refused `401 Unauthorized` with
//! `error="invalid_token"` otherwise, before anything runs:
//!
//! - **Signature.** It is signed with an asymmetric algorithm (RS256/384/512, PS256/384/512,
//!   ES256/384, EdDSA) by a key of the issuer's JWKS: the key its `kid` names, or the only key
//!   of the set when it names none. Keys are fetched from the JWKS URI (given, or discovered
//!   from the issuer's metadata), kept, and fetched again once they are older than the
//!   [maximum age](JwtAuthenticatorBuilder::jwks_max_age), or when a token names a key the set
//!   lacks (a rotation), at most once per [interval](JwtAuthenticatorBuilder::jwks_refetch_interval).
//! - **Issuer.** Its `iss` is the issuer, exactly.
//! - **Audience.** Its `aud` is, or holds, this server's resource URI (RFC 8707): a token the
//!   authorization server issued for another resource is not accepted here.
//! - **Time.** It has an `exp`, which has not passed, and a `nbf`, when present, which has:
//!   each with a clock skew allowance of 60 seconds unless
//!   [set otherwise](JwtAuthenticatorBuilder::leeway).
//! - **Caller.** It has a `sub`, not empty, which becomes the [`Principal`]'s id; the tenant is
//!   the [tenant claim](JwtAuthenticatorBuilder::tenant_claim) when one is set (a token without
//!   it is refused), else the subject itself. Its `scope` (space-separated) or `scp` (a list)
//!   claim becomes the principal's scopes.
//!
//! Keys the issuer cannot be asked for (its JWKS does not answer, and none were fetched before)
//! answer `503 Service Unavailable`: the token may be fine, and nothing runs.
//!
//! ```no_run
//! use toolkey::providers::mcp::http::{McpHttp, ProtectedResource};
//! use toolkey::providers::mcp::oauth::JwtAuthenticator;
//!
//! # async fn serve(toolbox: toolkey::Toolbox) -> Result<(), Box<dyn std::error::Error>> {
//! const ISSUER: &str = "https://auth.example.com";
//! const RESOURCE: &str = "https://mcp.example.com/mcp";
//!
//! let tokens = JwtAuthenticator::builder(ISSUER, RESOURCE)
//!     .tenant_claim("org_id")
//!     .build()?;
//! let resource = ProtectedResource::new(RESOURCE)?.with_authorization_server(ISSUER);
//! let mcp = McpHttp::new(toolbox, tokens)
//!     .with_protected_resource(resource)
//!     .with_allowed_hosts(["mcp.example.com"])
//!     .require_scopes("send_invoice", ["invoices:write"])?;
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! mcp.serve(listener, std::future::pending()).await?;
//! # Ok(()) }
//! ```

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::http::{bearer_token, Authenticator, ConfigError, Parts, Principal, Refusal};

/// The clock skew allowed on `exp` and `nbf` unless set otherwise.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);
/// How long fetched keys are used before they are fetched again, unless set otherwise.
pub const DEFAULT_JWKS_MAX_AGE: Duration = Duration::from_secs(600);
/// The least time between two fetches of the keys, unless set otherwise.
pub const DEFAULT_JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(30);

/// How long a fetch from the issuer may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata or JWKS document read from the issuer.
const DOCUMENT_LIMIT: usize = 1024 * 1024;

/// An [`Authenticator`] for bearer JWTs of one issuer, issued for this server: see the
/// [module docs](self) for what it checks. Cheap to clone; clones share their keys.
#[derive(Clone)]
pub struct JwtAuthenticator {
    inner: Arc<Inner>,
}

/// Settings for a [`JwtAuthenticator`]; made by [`JwtAuthenticator::builder`].
#[derive(Debug, Clone)]
pub struct JwtAuthenticatorBuilder {
    issuer: String,
    audience: String,
    jwks_uri: Option<String>,
    leeway: Duration,
    tenant_claim: Option<String>,
    max_age: Duration,
    refetch_interval: Duration,
}

impl JwtAuthenticator {
    /// An authenticator for tokens `issuer` issued for `audience`: this server's resource URI,
    /// as [`ProtectedResource::new`](super::http::ProtectedResource::new) names it.
    pub fn builder(
        issuer: impl Into<String>,
        audience: impl Into<String>,
    ) -> JwtAuthenticatorBuilder {
        JwtAuthenticatorBuilder {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks_uri: None,
            leeway: DEFAULT_LEEWAY,
            tenant_claim: None,
            max_age: DEFAULT_JWKS_MAX_AGE,
            refetch_interval: DEFAULT_JWKS_REFETCH_INTERVAL,
        }
    }
}

impl JwtAuthenticatorBuilder {
    /// Where the issuer publishes its keys. When not set, it is read from the issuer's
    /// metadata (RFC 8414's `/.well-known/oauth-authorization-server`, then OpenID Connect's
    /// `/.well-known/openid-configuration`), whose `issuer` must be the issuer.
    pub fn jwks_uri(mut self, uri: impl Into<String>) -> Self {
        self.jwks_uri = Some(uri.into());
        self
    }

    /// The clock skew allowed when `exp` and `nbf` are checked; 60 seconds when not set.
    pub fn leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// The claim whose value (a string, not empty) is the caller's tenant, `org_id` say: the
    /// principals of one tenant share its records. A token without it is refused. When not
    /// set, each subject is a tenant of its own.
    pub fn tenant_claim(mut self, claim: impl Into<String>) -> Self {
        self.tenant_claim = Some(claim.into());
        self
    }

    /// How long fetched keys are used before they are fetched again; 10 minutes when not set.
    pub fn jwks_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The least time between two fetches of the keys, so tokens naming keys the issuer never
    /// published cannot make the server ask it at every request; 30 seconds when not set. A
    /// key published within this time of the last fetch is picked up once it has passed.
    pub fn jwks_refetch_interval(mut self, interval: Duration) -> Self {
        self.refetch_interval = interval;
        self
    }

    /// The authenticator; an error when the issuer or the JWKS URI is not an absolute
    /// `https://` or `http://` URI. Keys are fetched at the first token, not here.
    pub fn build(self) -> Result<JwtAuthenticator, ConfigError> {
        let uris = std::iter::once(&self.issuer).chain(&self.jwks_uri);
        if let Some(bad) = uris.into_iter().find(|uri| !is_http_uri(uri)) {
            return Err(ConfigError::InvalidUri(bad.clone()));
        }
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|err| ConfigError::HttpClient(err.to_string()))?;
        Ok(JwtAuthenticator {
            inner: Arc::new(Inner {
                keys: RwLock::new(None),
                refresh: tokio::sync::Mutex::new(Fetches {
                    last: None,
                    jwks_uri: self.jwks_uri.clone(),
                }),
                client,
                settings: self,
            }),
        })
    }
}

struct Inner {
    settings: JwtAuthenticatorBuilder,
    client: reqwest::Client,
    /// The keys last fetched.
    keys: RwLock<Option<Arc<Keys>>>,
    /// Held while the keys are fetched, so concurrent requests fetch once.
    refresh: tokio::sync::Mutex<Fetches>,
}

/// When the keys were last asked for, and where they are.
struct Fetches {
    last: Option<Instant>,
    jwks_uri: Option<String>,
}

/// The usable keys of one JWKS, and when it was fetched.
struct Keys {
    keys: Vec<Key>,
    fetched: Instant,
}

struct Key {
    kid: Option<String>,
    /// The algorithm the JWKS binds the key to, when it does.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl Keys {
    /// The key a token's header names: by `kid`, or the only key when it names none.
    fn find(&self, kid: Option<&str>) -> Option<&Key> {
        match kid {
            Some(kid) => self.keys.iter().find(|key| key.kid.as_deref() == Some(kid)),
            None => match &self.keys[..] {
                [only] => Some(only),
                _ => None,
            },
        }
    }
}

#[async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, request: &Parts) -> Result<Principal, Refusal> {
        let token = bearer_token(request).ok_or_else(|| {
            Refusal::unauthenticated(
                "this server needs an OAuth bearer token: get one from the authorization server its metadata names",
            )
        })?;
        self.inner.check(token).await
    }
}

impl Inner {
    async fn check(&self, token: &str) -> Result<Principal, Refusal> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| invalid("the bearer token is not a JWT"))?;
        if !ASYMMETRIC.contains(&header.alg) {
            return Err(invalid(format!(
                "the token is signed with {:?}, which this server does not accept: it takes only tokens signed with a key its issuer publishes",
                header.alg
            )));
        }
        let keys = self.keys_with(header.kid.as_deref()).await?;
        let key = keys
            .find(header.kid.as_deref())
            .ok_or_else(|| invalid("the token is signed with a key the issuer does not publish"))?;
        if key.alg.is_some_and(|alg| alg != header.alg) {
            return Err(invalid(
                "the token's algorithm is not the one its key is published for",
            ));
        }
        let settings = &self.settings;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = settings.leeway.as_secs();
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation)
            .map_err(|err| self.refusal(err.into_kind()))?
            .claims;
        self.principal(&claims)
    }

    /// Why a token that did not validate is refused, as its holder reads it.
    fn refusal(&self, kind: ErrorKind) -> Refusal {
        let settings = &self.settings;
        invalid(match kind {
            ErrorKind::ExpiredSignature => "the token has expired".to_string(),
            ErrorKind::ImmatureSignature => {
                "the token is not valid yet: its `nbf` is still to come".to_string()
            }
            ErrorKind::InvalidAudience => format!(
                "the token was not issued for this server: its audience is not `{}`",
                settings.audience
            ),
            ErrorKind::InvalidIssuer => {
                format!("the token was not issued by `{}`", settings.issuer)
            }
            ErrorKind::InvalidSignature => "the token's signature does not verify".to_string(),
            ErrorKind::MissingRequiredClaim(claim) => format!("the token has no `{claim}` claim"),
            ErrorKind::InvalidClaimFormat(claim) => {
                format!("the token's `{claim}` claim is not valid")
            }
            ErrorKind::InvalidAlgorithm => {
                "the token's algorithm does not fit the key it names".to_string()
            }
            _ => "the token is not valid".to_string(),
        })
    }

    /// The principal a validated token's claims name.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, Refusal> {
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|sub| !sub.is_empty())
            .ok_or_else(|| invalid("the token's `sub` claim is not a non-empty string"))?;
        let mut principal = Principal::new(subject);
        if let Some(claim) = &self.settings.tenant_claim {
            let tenant = claims
                .get(claim)
                .and_then(Value::as_str)
                .filter(|tenant| !tenant.is_empty())
                .ok_or_else(|| {
                    invalid(format!(
                        "the token has no `{claim}` claim naming its tenant"
                    ))
                })?;
            principal = principal.with_tenant(tenant);
        }
        let scopes: Vec<&str> = match (claims.get("scope"), claims.get("scp")) {
            (Some(Value::String(scope)), _) => scope.split(' ').filter(|s| !s.is_empty()).collect(),
            (_, Some(Value::Array(scp))) => scp.iter().filter_map(Value::as_str).collect(),
            (_, Some(Value::String(scp))) => scp.split(' ').filter(|s| !s.is_empty()).collect(),
            _ => Vec::new(),
        };
        Ok(principal.with_scopes(scopes))
    }

    /// The keys to check a token naming `kid` with: those kept, unless they are too old, or
    /// lack `kid` and may be fetched again.
    async fn keys_with(&self, kid: Option<&str>) -> Result<Arc<Keys>, Refusal> {
        let kept = self.kept();
        if let Some(keys) = kept.as_ref().filter(|keys| keys.find(kid).is_some()) {
            if keys.fetched.elapsed() < self.settings.max_age {
                return Ok(keys.clone());
            }
            // Too old, and still holding the key: while another request fetches them again,
            // they serve, so a slow issuer does not hold up every request.
            let Ok(fetches) = self.refresh.try_lock() else {
                return Ok(keys.clone());
            };
            return self.refresh(fetches, Some(keys.fetched)).await;
        }
        let fetches = self.refresh.lock().await;
        self.refresh(fetches, kept.map(|keys| keys.fetched)).await
    }

    fn kept(&self) -> Option<Arc<Keys>> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Fetches the keys again (`fetches` held, so one request at a time does), unless another
    /// request did since `seen` was fetched, or the last fetch was within the refetch interval:
    /// then the keys kept. The keys kept too when the issuer does not answer; a `503` when there
    /// are none.
    async fn refresh(
        &self,
        mut fetches: tokio::sync::MutexGuard<'_, Fetches>,
        seen: Option<Instant>,
    ) -> Result<Arc<Keys>, Refusal> {
        let kept = self.kept();
        if let Some(keys) = &kept {
            if Some(keys.fetched) != seen {
                return Ok(keys.clone());
            }
        }
        let recent = fetches
            .last
            .is_some_and(|last| last.elapsed() < self.settings.refetch_interval);
        if !recent {
            fetches.last = Some(Instant::now());
            match self.fetch(&mut fetches).await {
                Ok(keys) => {
                    let keys = Arc::new(keys);
                    *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Some(keys.clone());
                    return Ok(keys);
                }
                Err(err) => tracing::warn!(
                    issuer = %self.settings.issuer,
                    error = %err,
                    "toolkey: the issuer's keys could not be fetched"
                ),
            }
        }
        kept.ok_or_else(|| {
            Refusal::unavailable(
                "this server cannot check tokens now: its authorization server's keys could not be fetched; try again later",
            )
        })
    }

    /// The issuer's keys, read from its JWKS URI, found first when not known.
    async fn fetch(&self, fetches: &mut Fetches) -> Result<Keys, String> {
        let jwks_uri = match &fetches.jwks_uri {
            Some(uri) => uri.clone(),
            None => {
                let uri = self.discover().await?;
                fetches.jwks_uri = Some(uri.clone());
                uri
            }
        };
        let set: JwkSet = serde_json::from_value(self.get(&jwks_uri).await?)
            .map_err(|err| format!("{jwks_uri} is not a JWKS: {err}"))?;
        let keys = set.keys.iter().filter_map(usable).collect();
        Ok(Keys {
            keys,
            fetched: Instant::now(),
        })
    }

    /// The JWKS URI the issuer's metadata names.
    async fn discover(&self) -> Result<String, String> {
        let issuer = self.settings.issuer.trim_end_matches('/');
        let mut failures = Vec::new();
        for url in metadata_urls(issuer) {
            let document = match self.get(&url).await {
                Ok(document) => document,
                Err(err) => {
                    failures.push(err);
                    continue;
                }
            };
            if document.get("issuer").and_then(Value::as_str) != Some(&self.settings.issuer) {
                failures.push(format!("{url} names another issuer"));
                continue;
            }
            match document.get("jwks_uri").and_then(Value::as_str) {
                Some(uri) if is_http_uri(uri) => return Ok(uri.to_string()),
                _ => failures.push(format!("{url} names no JWKS URI")),
            }
        }
        Err(failures.join("; "))
    }

    /// A JSON document from the issuer, at most [`DOCUMENT_LIMIT`] bytes.
    async fn get(&self, url: &str) -> Result<Value, String> {
        let mut response = self
            .client
            .get(url)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|err| format!("{url}: {err}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| format!("{url}: {err}"))?
        {
            if body.len() + chunk.len() > DOCUMENT_LIMIT {
                return Err(format!("{url} answered more than {DOCUMENT_LIMIT} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|err| format!("{url} is not JSON: {err}"))
    }
}

/// The algorithms a token may be signed with: a public key's. A shared secret in a published
/// JWKS would let anyone sign.
const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// A JWK as a key tokens may be checked with: a public key (RSA, EC, OKP) for signatures;
/// `None` for a shared secret, an encryption key, or one this crate cannot read.
fn usable(jwk: &Jwk) -> Option<Key> {
    use jsonwebtoken::jwk::PublicKeyUse;
    let public = matches!(
        jwk.algorithm,
        AlgorithmParameters::RSA(_)
            | AlgorithmParameters::EllipticCurve(_)
            | AlgorithmParameters::OctetKeyPair(_)
    );
    let for_signing = !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption));
    if !public || !for_signing {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        // An encryption algorithm (`RSA-OAEP`) names no signature algorithm: not a signing key.
        Some(alg) => Some(alg.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key: DecodingKey::from_jwk(jwk).ok()?,
    })
}

/// Where an issuer's metadata may be: RFC 8414's well-known URI (inserted before the issuer's
/// path), then OpenID Connect's (appended to it).
fn metadata_urls(issuer: &str) -> Vec<String> {
    let (origin, path) = match issuer.find("://").map(|at| at + 3) {
        Some(start) => match issuer[start..].find('/') {
            Some(slash) => issuer.split_at(start + slash),
            None => (issuer, ""),
        },
        None => (issuer, ""),
    };
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{issuer}/.well-known/openid-configuration"),
    ]
}

/// Whether `uri` is an absolute `https://` or `http://` URI with a host.
fn is_http_uri(uri: &str) -> bool {
    uri.parse::<http::Uri>().is_ok_and(|parsed| {
        matches!(parsed.scheme_str(), Some("https" | "http")) && parsed.authority().is_some()
    })
}

/// A token that does not prove who calls: `401`, with `error="invalid_token"`.
fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::unauthenticated(message)
}

#[cfg(test)]
mod tests {
    use super::metadata_urls;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_and_openid_connect_put_it() {
        assert_eq!(
            metadata_urls("https://auth.example.com"),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://auth.example.com/tenant/1"),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant/1",
                "https://auth.example.com/tenant/1/.well-known/openid-configuration"
            ]
        );
    }
}
