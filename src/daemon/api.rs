//! The HTTP API (see README, "Node daemon"). The unix socket is guarded by its file
//! permissions; the TCP listener asks for the catalog's bearer token on `/v1/`, while the
//! probes and `/metrics` stay open for the kubelet and Prometheus.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use super::flight::{self, Warm};
use super::protocol::{DatasetStatus, ErrorBody, LeaseRequest, State as DatasetState, WarmRequest};
use super::registry::{self, LeaseRefused};
use super::Daemon;

/// Longest holder id (a pod UID is 36 characters).
const MAX_HOLDER_LEN: usize = 253;
/// How long `/healthz` waits for the registry.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

type Shared = State<Arc<Daemon>>;

/// The routes; with `require_token`, `/v1/` asks for the bearer token.
pub(crate) fn router(daemon: Arc<Daemon>, require_token: bool) -> Router {
    let mut v1 = Router::new()
        .route("/v1/datasets", get(list))
        .route("/v1/datasets/{name}", get(status))
        .route("/v1/datasets/{name}/warm", post(warm))
        .route(
            "/v1/datasets/{name}/leases/{holder}",
            put(take_lease).delete(release_lease),
        )
        .route("/v1/leases", get(leases));
    if require_token {
        v1 = v1.layer(middleware::from_fn_with_state(daemon.clone(), check_token));
    }
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(v1)
        .with_state(daemon)
}

/// An error answer: a status and a JSON body naming the problem.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(ErrorBody {
            error: message.into(),
        }),
    )
        .into_response()
}

async fn check_token(State(daemon): Shared, request: Request, next: Next) -> Response {
    let expected = daemon.catalog().listen.token.clone().unwrap_or_default();
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if expected.is_empty() || !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer TOKEN)",
        );
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A lease change the daemon holds but could not make durable: the caller must not rely on it.
fn unsaved(err: std::io::Error) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the lease changed but saving the daemon state failed: {err}"),
    )
}

/// Alive when the registry answers: a lock held too long (a stuck task) or poisoned (a panic
/// while holding it) means the daemon can no longer serve.
async fn healthz(State(daemon): Shared) -> Response {
    let probe = tokio::task::spawn_blocking(move || daemon.registry.lock().is_ok());
    match tokio::time::timeout(HEALTH_TIMEOUT, probe).await {
        Ok(Ok(true)) => "ok\n".into_response(),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the registry does not answer",
        ),
    }
}

async fn readyz(State(daemon): Shared) -> Response {
    match *daemon.stop.borrow() {
        false => "ready\n".into_response(),
        true => error(StatusCode::SERVICE_UNAVAILABLE, "stopping"),
    }
}

async fn metrics(State(daemon): Shared) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(super::metrics::CONTENT_TYPE),
        )],
        daemon.render_metrics(),
    )
        .into_response()
}

/// Parses an optional JSON body: empty means the defaults.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Box<Response>> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("malformed request body: {e}"),
        ))
    })
}

fn unknown(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no dataset {name:?} in the catalog"),
    )
}

async fn list(State(daemon): Shared) -> Json<Vec<DatasetStatus>> {
    let catalog = daemon.catalog();
    let registry = daemon.registry();
    Json(
        catalog
            .datasets
            .keys()
            .map(|name| registry.status(&daemon.root, name))
            .collect(),
    )
}

async fn status(State(daemon): Shared, Path(name): Path<String>) -> Response {
    if !daemon.catalog().datasets.contains_key(&name) {
        return unknown(&name);
    }
    Json(daemon.registry().status(&daemon.root, &name)).into_response()
}

async fn warm(State(daemon): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    let request: WarmRequest = match body(&bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let Some(dataset) = daemon.catalog().datasets.get(&name).cloned() else {
        return unknown(&name);
    };
    if *daemon.stop.borrow() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping");
    }
    let mut done = match flight::warm(&daemon, &name, &dataset) {
        Warm::Known(status) => return (warm_code(status.state), Json(status)).into_response(),
        Warm::Hydrating(done) => done,
    };
    if request.wait {
        // A closed channel means the flight's task is gone: its end is in the status.
        let _ = done.wait_for(|ended| *ended).await;
    }
    let status = daemon.registry().status(&daemon.root, &name);
    let code = warm_code(status.state);
    let location = HeaderValue::from_str(&format!("/v1/datasets/{name}"))
        .expect("catalog names are valid header values");
    (code, [(header::LOCATION, location)], Json(status)).into_response()
}

/// A warm answer's code: 200 ready (also stale), 500 failed, 202 still hydrating.
fn warm_code(state: DatasetState) -> StatusCode {
    match state {
        DatasetState::Ready => StatusCode::OK,
        DatasetState::Failed => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::ACCEPTED,
    }
}

async fn take_lease(
    State(daemon): Shared,
    Path((name, holder)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let request: LeaseRequest = match body(&bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let catalog = daemon.catalog();
    if !catalog.datasets.contains_key(&name) {
        return unknown(&name);
    }
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN || holder.chars().any(char::is_control) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("a lease holder is 1 to {MAX_HOLDER_LEN} printable characters"),
        );
    }
    let ttl = request
        .ttl_seconds
        .unwrap_or(catalog.cache.default_lease_ttl.as_secs())
        .min(catalog.cache.max_lease_ttl.as_secs());
    if ttl == 0 {
        return error(StatusCode::BAD_REQUEST, "ttl_seconds must be at least 1");
    }
    let expires_at = registry::now_unix().saturating_add(ttl);
    let taken = daemon
        .registry()
        .lease(&name, &holder, request.snapshot.as_deref(), expires_at);
    match taken {
        Ok(lease) => match daemon.save_state() {
            Ok(()) => Json(lease).into_response(),
            Err(err) => unsaved(err),
        },
        Err(LeaseRefused::NotReady) => error(
            StatusCode::CONFLICT,
            format!("dataset {name:?} has no ready snapshot to lease; warm it first"),
        ),
        Err(LeaseRefused::NoSuchSnapshot(digest)) => error(
            StatusCode::CONFLICT,
            format!("dataset {name:?} has no ready snapshot {digest}"),
        ),
    }
}

async fn release_lease(
    State(daemon): Shared,
    Path((name, holder)): Path<(String, String)>,
) -> Response {
    let removed = daemon
        .registry()
        .leases
        .remove(&(name.clone(), holder.clone()));
    match removed {
        Some(_) => match daemon.save_state() {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(err) => unsaved(err),
        },
        None => error(
            StatusCode::NOT_FOUND,
            format!("{holder:?} holds no lease on {name:?}"),
        ),
    }
}

async fn leases(State(daemon): Shared) -> Response {
    let leases: Vec<_> = daemon.registry().leases.values().cloned().collect();
    Json(leases).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-toke", b"secret-token"));
        assert!(!constant_time_eq(b"secret-tokem", b"secret-token"));
    }

    #[test]
    fn an_empty_body_means_defaults_and_junk_is_rejected() {
        let request: WarmRequest = body(&Bytes::from_static(b" \n")).unwrap();
        assert!(!request.wait);
        let junk = body::<WarmRequest>(&Bytes::from_static(b"{\"wait\": \"yes\"}"));
        assert_eq!(junk.unwrap_err().status(), StatusCode::BAD_REQUEST);
    }
}
