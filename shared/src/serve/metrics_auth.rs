//! Who may read the secure metrics port, decided as controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` does: the caller's bearer token
//! goes to a TokenReview, the user it names to a SubjectAccessReview for the
//! non-resource URL and verb of the request (`get /metrics`).
//!
//! Answers are cached briefly, keyed by a SHA-256 of the token (tokens are
//! never kept): an authenticated token 2 min, a rejected one 10 s; an allowed
//! request 5 min, a denied one 30 s. A failing review API is never cached.
//! The two reviews sit behind [`Reviews`] so the decision is tested without a
//! cluster; [`KubeReviews`] is the real one.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::rules::sync::LockExt;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::rules::ttl::TtlCache;

/// The user a token belongs to, as the TokenReview reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the TokenReview said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authn {
    User(UserInfo),
    /// Not authenticated; the API server's reason, if any.
    Rejected(String),
}

/// What the SubjectAccessReview said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authz {
    pub allowed: bool,
    pub reason: String,
}

/// A review API call that failed (not a "no": the question got no answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error(
        "TokenReview (authentication.k8s.io/v1) failed: {0}; the operator's ServiceAccount needs create on tokenreviews (ClusterRole nmo-metrics-auth)"
    )]
    TokenReview(String),
    #[error(
        "SubjectAccessReview (authorization.k8s.io/v1) failed: {0}; the operator's ServiceAccount needs create on subjectaccessreviews (ClusterRole nmo-metrics-auth)"
    )]
    SubjectAccessReview(String),
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The two questions asked of the API server.
pub trait Reviews: Send + Sync {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Authn, ReviewError>>;
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        path: &'a str,
        verb: &'a str,
    ) -> BoxFuture<'a, Result<Authz, ReviewError>>;
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// 401: no bearer token, or one the API server does not accept.
    Unauthorized(String),
    /// 403: a known user without the permission.
    Forbidden {
        user: String,
        reason: String,
    },
    /// 500: a review could not be made.
    Failed(ReviewError),
}

/// How long answers are reused.
#[derive(Debug, Clone, Copy)]
pub struct CacheTtls {
    pub authenticated: Duration,
    pub rejected: Duration,
    pub allowed: Duration,
    pub denied: Duration,
    /// Entries per cache; the soonest to expire goes first when full.
    pub max_entries: usize,
}

impl Default for CacheTtls {
    fn default() -> Self {
        CacheTtls {
            authenticated: Duration::from_secs(120),
            rejected: Duration::from_secs(10),
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
            max_entries: 1024,
        }
    }
}

type TokenHash = [u8; 32];

/// Decides requests to the secure metrics port; share it (`Arc`) across connections.
pub struct Authorizer {
    reviews: Arc<dyn Reviews>,
    ttls: CacheTtls,
    users: Mutex<TtlCache<TokenHash, Authn>>,
    decisions: Mutex<TtlCache<(TokenHash, String, String), Authz>>,
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The Kubernetes verb of an HTTP method, as the API server maps it for
/// non-resource URLs.
pub fn verb_for(method: &Method) -> String {
    match *method {
        Method::GET | Method::HEAD => "get".into(),
        Method::POST => "create".into(),
        Method::PUT => "update".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE => "delete".into(),
        ref other => other.as_str().to_ascii_lowercase(),
    }
}

impl Authorizer {
    pub fn new(reviews: Arc<dyn Reviews>, ttls: CacheTtls) -> Self {
        Authorizer {
            reviews,
            ttls,
            users: Mutex::new(TtlCache::new(ttls.max_entries)),
            decisions: Mutex::new(TtlCache::new(ttls.max_entries)),
        }
    }

    /// Decide a request from its `Authorization` header, path and verb.
    pub async fn check(
        &self,
        authorization: Option<&HeaderValue>,
        path: &str,
        verb: &str,
    ) -> Verdict {
        self.check_at(authorization, path, verb, Instant::now())
            .await
    }

    async fn check_at(
        &self,
        authorization: Option<&HeaderValue>,
        path: &str,
        verb: &str,
        now: Instant,
    ) -> Verdict {
        let Some(token) = bearer_token(authorization) else {
            return Verdict::Unauthorized("no bearer token in the Authorization header".into());
        };
        let key: TokenHash = {
            let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            let mut k = [0u8; 32];
            k.copy_from_slice(d.as_ref());
            k
        };

        let authn = match self.authenticated(token, key, now).await {
            Ok(a) => a,
            Err(e) => return Verdict::Failed(e),
        };
        let user = match authn {
            Authn::User(u) => u,
            Authn::Rejected(reason) => return Verdict::Unauthorized(reason),
        };

        let authz = match self.authorized(&user, key, path, verb, now).await {
            Ok(a) => a,
            Err(e) => return Verdict::Failed(e),
        };
        if authz.allowed {
            Verdict::Allowed
        } else {
            Verdict::Forbidden {
                user: user.username,
                reason: authz.reason,
            }
        }
    }

    /// Who `token` is (a TokenReview, or the answer kept for its hash).
    async fn authenticated(
        &self,
        token: &str,
        key: TokenHash,
        now: Instant,
    ) -> Result<Authn, ReviewError> {
        if let Some(a) = self.users.locked().get(&key, now).cloned() {
            return Ok(a);
        }
        let a = self.reviews.authenticate(token).await?;
        let ttl = match a {
            Authn::User(_) => self.ttls.authenticated,
            Authn::Rejected(_) => self.ttls.rejected,
        };
        self.users.locked().insert(key, a.clone(), ttl, now);
        Ok(a)
    }

    /// Whether `user` may `verb` `path` (a SubjectAccessReview, or the answer kept).
    async fn authorized(
        &self,
        user: &UserInfo,
        key: TokenHash,
        path: &str,
        verb: &str,
        now: Instant,
    ) -> Result<Authz, ReviewError> {
        let dkey = (key, path.to_string(), verb.to_string());
        if let Some(a) = self.decisions.locked().get(&dkey, now).cloned() {
            return Ok(a);
        }
        let a = self.reviews.authorize(user, path, verb).await?;
        let ttl = if a.allowed {
            self.ttls.allowed
        } else {
            self.ttls.denied
        };
        self.decisions.locked().insert(dkey, a.clone(), ttl, now);
        Ok(a)
    }
}

/// axum middleware: lets a request through only when [`Authorizer::check`] allows it.
pub async fn require_authorization(
    State(auth): State<Arc<Authorizer>>,
    req: Request,
    next: Next,
) -> Response {
    let verb = verb_for(req.method());
    let path = req.uri().path().to_string();
    match auth
        .check(req.headers().get(header::AUTHORIZATION), &path, &verb)
        .await
    {
        Verdict::Allowed => next.run(req).await,
        Verdict::Unauthorized(reason) => {
            tracing::debug!(%path, %reason, "metrics request not authenticated");
            (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response()
        }
        Verdict::Forbidden { user, reason } => {
            tracing::debug!(%path, %user, %reason, "metrics request not authorized");
            (
                StatusCode::FORBIDDEN,
                format!("Forbidden (user={user}, verb={verb}, path={path})\n"),
            )
                .into_response()
        }
        Verdict::Failed(e) => {
            tracing::error!(%path, error = %e, "cannot authorize a metrics request");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error: the authorization check failed; see the operator's log\n",
            )
                .into_response()
        }
    }
}

/// The reviews, asked of the API server with the operator's own client.
pub struct KubeReviews {
    client: Client,
}

impl KubeReviews {
    pub fn new(client: Client) -> Self {
        KubeReviews { client }
    }

    /// Create a review object; the API server answers in its status.
    async fn create<K>(
        &self,
        review: &K,
        failed: fn(String) -> ReviewError,
    ) -> Result<K, ReviewError>
    where
        K: kube::Resource
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        Api::<K>::all(self.client.clone())
            .create(&PostParams::default(), review)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    async fn token_review(&self, token: &str) -> Result<Authn, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = self.create(&review, ReviewError::TokenReview).await?;
        let status = answer.status.unwrap_or_default();
        match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Ok(Authn::User(UserInfo {
                username: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            })),
            _ => Ok(Authn::Rejected(
                status
                    .error
                    .unwrap_or_else(|| "token not authenticated".to_string()),
            )),
        }
    }

    async fn access_review(
        &self,
        user: &UserInfo,
        path: &str,
        verb: &str,
    ) -> Result<Authz, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self
            .create(&review, ReviewError::SubjectAccessReview)
            .await?;
        let status = answer.status.unwrap_or_default();
        if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty()) {
            // The authorizer said no because it could not evaluate, e.g. a
            // webhook authorizer that is down: still a "no", but say why.
            tracing::debug!(user = %user.username, error = %e, "SubjectAccessReview evaluation error");
        }
        Ok(Authz {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

impl Reviews for KubeReviews {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Authn, ReviewError>> {
        Box::pin(self.token_review(token))
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        path: &'a str,
        verb: &'a str,
    ) -> BoxFuture<'a, Result<Authz, ReviewError>> {
        Box::pin(self.access_review(user, path, verb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Tokens: "reader" may get /metrics, "stranger" may not, "bad" is not a
    /// token, "authn-down" / "authz-down" make a review fail.
    #[derive(Default)]
    struct Fake {
        token_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
    }

    impl Reviews for Fake {
        fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Authn, ReviewError>> {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "authn-down" => Err(ReviewError::TokenReview("connection refused".into())),
                    "bad" => Ok(Authn::Rejected("invalid bearer token".into())),
                    name => Ok(Authn::User(UserInfo {
                        username: format!("system:serviceaccount:mon:{name}"),
                        uid: "u-1".into(),
                        groups: vec!["system:serviceaccounts".into()],
                        extra: BTreeMap::new(),
                    })),
                }
            })
        }

        fn authorize<'a>(
            &'a self,
            user: &'a UserInfo,
            path: &'a str,
            verb: &'a str,
        ) -> BoxFuture<'a, Result<Authz, ReviewError>> {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if user.username.ends_with(":authz-down") {
                    return Err(ReviewError::SubjectAccessReview("503".into()));
                }
                let allowed =
                    user.username.ends_with(":reader") && path == "/metrics" && verb == "get";
                Ok(Authz {
                    allowed,
                    reason: if allowed { "" } else { "no RBAC rule" }.into(),
                })
            })
        }
    }

    fn bearer(token: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header")
    }

    fn setup() -> (Arc<Fake>, Authorizer) {
        let fake = Arc::new(Fake::default());
        let auth = Authorizer::new(fake.clone(), CacheTtls::default());
        (fake, auth)
    }

    async fn at(auth: &Authorizer, token: Option<&str>, now: Instant) -> Verdict {
        let h = token.map(bearer);
        auth.check_at(h.as_ref(), "/metrics", "get", now).await
    }

    #[test]
    fn bearer_tokens_and_verbs() {
        assert_eq!(bearer_token(Some(&bearer("abc"))), Some("abc"));
        assert_eq!(
            bearer_token(Some(&HeaderValue::from_static("bearer  x "))),
            Some("x")
        );
        assert_eq!(
            bearer_token(Some(&HeaderValue::from_static("Basic abc"))),
            None
        );
        assert_eq!(
            bearer_token(Some(&HeaderValue::from_static("Bearer "))),
            None
        );
        assert_eq!(bearer_token(None), None);
        assert_eq!(verb_for(&Method::GET), "get");
        assert_eq!(verb_for(&Method::HEAD), "get");
        assert_eq!(verb_for(&Method::POST), "create");
    }

    #[tokio::test]
    async fn decisions() {
        let (_, auth) = setup();
        let now = Instant::now();
        assert!(matches!(
            at(&auth, None, now).await,
            Verdict::Unauthorized(_)
        ));
        assert_eq!(
            at(&auth, Some("bad"), now).await,
            Verdict::Unauthorized("invalid bearer token".into())
        );
        assert_eq!(at(&auth, Some("reader"), now).await, Verdict::Allowed);
        assert_eq!(
            at(&auth, Some("stranger"), now).await,
            Verdict::Forbidden {
                user: "system:serviceaccount:mon:stranger".into(),
                reason: "no RBAC rule".into()
            }
        );
        let other_path = auth
            .check_at(Some(&bearer("reader")), "/debug", "get", now)
            .await;
        assert!(
            matches!(other_path, Verdict::Forbidden { .. }),
            "{other_path:?}"
        );
    }

    #[tokio::test]
    async fn failing_reviews_are_errors_and_never_cached() {
        let (fake, auth) = setup();
        let now = Instant::now();
        for _ in 0..2 {
            let v = at(&auth, Some("authn-down"), now).await;
            assert!(
                matches!(v, Verdict::Failed(ReviewError::TokenReview(_))),
                "{v:?}"
            );
            let v = at(&auth, Some("authz-down"), now).await;
            match v {
                Verdict::Failed(e @ ReviewError::SubjectAccessReview(_)) => {
                    assert!(e.to_string().contains("subjectaccessreviews"), "{e}")
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            fake.token_reviews.load(Ordering::SeqCst),
            3,
            "authz-down's user is cached"
        );
        assert_eq!(fake.access_reviews.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn answers_are_cached_for_their_ttl() {
        let (fake, auth) = setup();
        let t0 = Instant::now();
        let reviews = |f: &Fake| {
            (
                f.token_reviews.load(Ordering::SeqCst),
                f.access_reviews.load(Ordering::SeqCst),
            )
        };
        assert_eq!(at(&auth, Some("reader"), t0).await, Verdict::Allowed);
        assert_eq!(
            at(&auth, Some("reader"), t0 + Duration::from_secs(60)).await,
            Verdict::Allowed
        );
        assert_eq!(
            reviews(&fake),
            (1, 1),
            "second request within both TTLs: no review"
        );
        // Past the token TTL (2 min), within the decision TTL (5 min).
        at(&auth, Some("reader"), t0 + Duration::from_secs(150)).await;
        assert_eq!(reviews(&fake), (2, 1));
        // Past both.
        at(&auth, Some("reader"), t0 + Duration::from_secs(400)).await;
        assert_eq!(reviews(&fake), (3, 2));

        // Denials and rejections are kept shorter.
        let t1 = t0 + Duration::from_secs(1000);
        at(&auth, Some("stranger"), t1).await;
        at(&auth, Some("stranger"), t1 + Duration::from_secs(20)).await;
        assert_eq!(reviews(&fake), (4, 3));
        at(&auth, Some("stranger"), t1 + Duration::from_secs(40)).await;
        assert_eq!(reviews(&fake), (4, 4), "denial expired after 30 s");
        at(&auth, Some("bad"), t1).await;
        at(&auth, Some("bad"), t1 + Duration::from_secs(5)).await;
        assert_eq!(reviews(&fake).0, 5);
        at(&auth, Some("bad"), t1 + Duration::from_secs(11)).await;
        assert_eq!(reviews(&fake).0, 6, "rejection expired after 10 s");
    }
}
