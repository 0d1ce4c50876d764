//! The HTTP API (see docs/daemon.md, "API"). The unix socket is guarded by its file
//! permissions and names each caller by its uid; the TCP listener asks for one of the catalog's
//! bearer tokens on `/v1/` and names the caller by it, while the probes and `/metrics` stay
//! open for the kubelet and Prometheus. Leases belong to the caller that took them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;

use super::catalog::{Dataset, Start};
use super::flight::{self, Warm};
use super::holder;
use super::identity::{self, Caller};
use super::protocol::{
    DatasetStatus, ErrorBody, LeaseRequest, PodIdentity, State as DatasetState, WantAnswer,
    WantRequest, WarmRequest, UNTIL_RELEASED,
};
use super::registry::{self, LeaseAsk, LeaseRefused};
use super::Daemon;
use crate::engine::schedule::{Unavailable, Wanted};
use crate::engine::streams::{RangeOutcome, RangeWanted, Readable};

/// How long `/healthz` waits for the registry.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

type Shared = State<Arc<Daemon>>;

/// The probes and `/metrics` alone, for a listener of their own.
pub(crate) fn probes_router(daemon: Arc<Daemon>) -> Router {
    probes()
        .layer(middleware::from_fn_with_state(daemon.clone(), body_in_time))
        .with_state(daemon)
}

fn probes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// The routes; with `require_token`, `/v1/` asks for the bearer token.
pub(crate) fn router(daemon: Arc<Daemon>, require_token: bool) -> Router {
    let mut v1 = Router::new()
        .route("/v1/datasets", get(list))
        .route("/v1/datasets/{name}", get(status))
        .route("/v1/datasets/{name}/warm", post(warm))
        .route("/v1/datasets/{name}/want", post(want))
        .route(
            "/v1/datasets/{name}/leases/{holder}",
            put(take_lease).delete(release_lease),
        )
        .route("/v1/leases", get(leases));
    if require_token {
        v1 = v1.layer(middleware::from_fn_with_state(daemon.clone(), check_token));
    }
    probes()
        .merge(v1)
        .layer(middleware::from_fn_with_state(daemon.clone(), body_in_time))
        .with_state(daemon)
}

/// The largest request body taken (every request's is a small JSON object).
const MAX_BODY: usize = 64 << 10;

/// Reads the whole request body within the header timeout before the handler runs: a caller
/// that sends a header and then nothing (or a trickle) is answered 408 and cut off, and cannot
/// hold the connection.
async fn body_in_time(State(daemon): Shared, request: Request, next: Next) -> Response {
    let limit = daemon.catalog().listen.header_timeout;
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(limit, axum::body::to_bytes(body, MAX_BODY)).await;
    let closing = |status: StatusCode, why: &str| {
        let mut response = error(status, why);
        let close = HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
        response
    };
    match read {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(_)) => closing(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large or broken",
        ),
        Err(_) => closing(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        ),
    }
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

/// Lets a request with one of the catalog's tokens through, named by that token.
async fn check_token(State(daemon): Shared, mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let catalog = daemon.catalog();
    let Some(token) = identity::find_token(&catalog.listen.tokens, given) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer TOKEN)",
        );
    };
    request.extensions_mut().insert(Caller::token(token));
    next.run(request).await
}

/// The catalog's dataset `name`, if the caller may use it. An unknown name is answered with
/// the nearest name the caller (and `pod`, when the request is for one) may use.
fn check_dataset(
    daemon: &Daemon,
    caller: &Caller,
    name: &str,
    pod: Option<&PodIdentity>,
) -> Result<Dataset, Box<Response>> {
    let catalog = daemon.catalog();
    let Some(dataset) = catalog.datasets.get(name).cloned() else {
        let pod_may_use = |known: &str| {
            pod.is_none_or(|pod| catalog.datasets[known].access.check(known, pod).is_ok())
        };
        let why =
            catalog.unknown_dataset(name, |known| caller.may_use(known) && pod_may_use(known));
        return Err(Box::new(error(StatusCode::NOT_FOUND, why)));
    };
    match caller.may_use(name) {
        true => Ok(dataset),
        false => Err(Box::new(error(
            StatusCode::FORBIDDEN,
            format!("{} may not use dataset {name:?}", caller.identity),
        ))),
    }
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

async fn list(State(daemon): Shared, caller: Extension<Caller>) -> Json<Vec<DatasetStatus>> {
    let catalog = daemon.catalog();
    let registry = daemon.registry();
    Json(
        catalog
            .datasets
            .iter()
            .filter(|(name, _)| caller.may_use(name))
            .map(|(name, dataset)| described(registry.status(&daemon.root, name), dataset))
            .collect(),
    )
}

async fn status(
    State(daemon): Shared,
    caller: Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    let dataset = match check_dataset(&daemon, &caller, &name, None) {
        Ok(dataset) => dataset,
        Err(response) => return *response,
    };
    Json(described(
        daemon.registry().status(&daemon.root, &name),
        &dataset,
    ))
    .into_response()
}

/// `status` with what the catalog says of its dataset.
fn described(mut status: DatasetStatus, dataset: &Dataset) -> DatasetStatus {
    status.lazy = dataset.start == Start::Lazy;
    status.shard = dataset.shard.map(|shard| shard.to_string());
    status.p2p = dataset.p2p;
    status
}

async fn warm(
    State(daemon): Shared,
    caller: Extension<Caller>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Response {
    let request: WarmRequest = match body(&bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let dataset = match check_dataset(&daemon, &caller, &name, request.pod.as_ref()) {
        Ok(dataset) => dataset,
        Err(response) => return *response,
    };
    if *daemon.stop.borrow() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping");
    }
    if let Some(pod) = &request.pod {
        if let Err(why) = dataset.access.check(&name, pod) {
            return error(StatusCode::FORBIDDEN, why.to_string());
        }
    }
    let mut done = match flight::warm(&daemon, &name, &dataset) {
        Warm::Known(status) => {
            let status = described(*status, &dataset);
            return (warm_code(status.state), Json(status)).into_response();
        }
        Warm::Hydrating(done) => done,
    };
    if request.wait {
        // A closed channel means the flight's task is gone: its end is in the status.
        let _ = done.wait_for(|ended| *ended).await;
    }
    let status = described(daemon.registry().status(&daemon.root, &name), &dataset);
    let code = warm_code(status.state);
    let location = HeaderValue::from_str(&format!("/v1/datasets/{name}"))
        .expect("catalog names are valid header values");
    (code, [(header::LOCATION, location)], Json(status)).into_response()
}

/// How long a want is held before it is answered 202 (ask again): no call outlives a client's
/// deadline, however large the file.
const WANT_HOLD: std::time::Duration = std::time::Duration::from_secs(15);

async fn want(
    State(daemon): Shared,
    caller: Extension<Caller>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Response {
    let request: WantRequest = match body(&bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    if let Err(response) = check_dataset(&daemon, &caller, &name, None) {
        return *response;
    }
    let wanted = {
        let registry = daemon.registry();
        let entry = registry.datasets.get(&name);
        let flight = entry
            .and_then(|e| e.flight.as_ref())
            .filter(|f| f.info().snapshot.as_deref() == Some(&request.snapshot));
        let unfinished = entry.and_then(|e| e.unfinished.get(&request.snapshot));
        match (flight.and_then(|f| f.schedule.get()), unfinished) {
            (Some(schedule), _) => match request.range {
                Some([start, end]) => Asked::Range(schedule.want_range(&request.key, start..end)),
                None => Asked::Whole(schedule.want(&request.key)),
            },
            _ if entry.is_some_and(|e| e.ready.contains_key(&request.snapshot)) => {
                Asked::Range(RangeWanted::Now(Ok(Readable::Whole)))
            }
            // Its ended hydration answers, unless it is hydrated again (then 409: ask again).
            (None, Some(unfinished)) if flight.is_none() => {
                Asked::Whole(unfinished.want(&request.key))
            }
            _ if entry.is_some_and(|e| e.failure.is_some() && e.flight.is_none()) => {
                let failure = entry.and_then(|e| e.failure.as_ref());
                let reason = failure.map(ToString::to_string).unwrap_or_default();
                let failed = format!("the hydration failed: {reason}");
                Asked::Range(RangeWanted::Now(Err(failed.into())))
            }
            _ => {
                return error(
                    StatusCode::CONFLICT,
                    format!(
                        "snapshot {} of {name} is neither hydrating nor ready on this node",
                        request.snapshot
                    ),
                )
            }
        }
    };
    let Some(outcome) = wanted.told().await else {
        return (StatusCode::ACCEPTED, Json(serde_json::json!({}))).into_response();
    };
    match outcome {
        Ok(readable) => Json(WantAnswer::from(readable)).into_response(),
        // Not the object's failure: the next daemon resumes the hydration.
        Err(_) if *daemon.stop.borrow() => {
            error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping")
        }
        Err(reason) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{}: {reason}", request.key),
        ),
    }
}

/// What a want asked the hydration: the whole file (an open by an older plugin, or an ended
/// hydration's), or a byte range.
enum Asked {
    Whole(Wanted),
    Range(RangeWanted),
}

impl Asked {
    /// The answer, once it comes within [`WANT_HOLD`].
    async fn told(self) -> Option<RangeOutcome> {
        let ended = || Unavailable::from("the hydration ended");
        match self {
            Self::Whole(Wanted::Now(outcome)) => Some(outcome.map(|()| Readable::Whole)),
            Self::Range(RangeWanted::Now(outcome)) => Some(outcome),
            Self::Whole(Wanted::Later(told)) => {
                let told = tokio::time::timeout(WANT_HOLD, told).await.ok()?;
                Some(
                    told.unwrap_or_else(|_| Err(ended()))
                        .map(|()| Readable::Whole),
                )
            }
            Self::Range(RangeWanted::Later(told)) => {
                let told = tokio::time::timeout(WANT_HOLD, told).await.ok()?;
                Some(told.unwrap_or_else(|_| Err(ended())))
            }
        }
    }
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
    caller: Extension<Caller>,
    Path((name, holder)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let request: LeaseRequest = match body(&bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    if let Err(response) = check_dataset(&daemon, &caller, &name, None) {
        return *response;
    }
    if let Err(bad) = holder::check(&holder) {
        return error(StatusCode::BAD_REQUEST, bad.to_string());
    }
    let catalog = daemon.catalog();
    let ask = LeaseAsk {
        pod: request.pod.as_deref(),
        ..lease_ask(&daemon, &caller)
    };
    if ask.pod.is_some() && !ask.admin {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not take a lease for a pod (listen.admins only)",
                caller.identity
            ),
        );
    }
    let expires_at = match request.until_released {
        true if !ask.admin => {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "{} may not take a lease until released (listen.admins only)",
                    caller.identity
                ),
            )
        }
        true => UNTIL_RELEASED,
        false => {
            let ttl = request
                .ttl_seconds
                .unwrap_or(catalog.cache.default_lease_ttl.as_secs())
                .min(catalog.cache.max_lease_ttl.as_secs());
            if ttl == 0 {
                return error(StatusCode::BAD_REQUEST, "ttl_seconds must be at least 1");
            }
            registry::now_unix().saturating_add(ttl)
        }
    };
    let key = (name.clone(), holder.clone());
    let (before, taken) = {
        let mut registry = daemon.registry();
        let before = registry.leases.get(&key).cloned();
        let taken = registry.lease(
            &name,
            &holder,
            request.snapshot.as_deref(),
            expires_at,
            &ask,
        );
        (before, taken)
    };
    match taken {
        Ok(lease) => match saved(&daemon).await {
            Ok(()) => Json(lease).into_response(),
            // Not saved, not in effect: what held before holds again.
            Err(response) => {
                let mut registry = daemon.registry();
                match before {
                    Some(before) => registry.leases.insert(key, before),
                    None => registry.leases.remove(&key),
                };
                response
            }
        },
        Err(refused) => lease_refused(&name, &holder, refused),
    }
}

async fn release_lease(
    State(daemon): Shared,
    caller: Extension<Caller>,
    Path((name, holder)): Path<(String, String)>,
) -> Response {
    if let Err(response) = check_dataset(&daemon, &caller, &name, None) {
        return *response;
    }
    let ask = lease_ask(&daemon, &caller);
    let released = daemon.registry().release(&name, &holder, &ask);
    match released {
        Ok(lease) => match saved(&daemon).await {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            // Not saved, so a restart would bring the lease back: it holds until it is.
            Err(response) => {
                let key = (lease.dataset.clone(), lease.holder.clone());
                daemon.registry().leases.entry(key).or_insert(lease);
                response
            }
        },
        Err(refused) => lease_refused(&name, &holder, refused),
    }
}

fn lease_ask<'a>(daemon: &Daemon, caller: &'a Caller) -> LeaseAsk<'a> {
    let catalog = daemon.catalog();
    LeaseAsk {
        caller,
        admin: catalog.listen.admins.contains(&caller.identity),
        cap: catalog.cache.max_leases_per_dataset,
        per_identity: catalog.cache.max_leases_per_identity,
        pod: None,
        now: registry::now_unix(),
    }
}

/// Waits for the lease change to be saved: the caller must not rely on one a restart loses.
async fn saved(daemon: &Daemon) -> Result<(), Response> {
    let generation = daemon.state_changed();
    daemon.state_durable(generation).await.map_err(|err| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("saving the daemon state failed, so the lease change is not in effect (what held before holds): {err}"),
        )
    })
}

fn lease_refused(name: &str, holder: &str, refused: LeaseRefused) -> Response {
    match refused {
        LeaseRefused::NotReady => error(
            StatusCode::CONFLICT,
            format!("dataset {name:?} has no ready snapshot to lease; warm it first"),
        ),
        LeaseRefused::NoSuchSnapshot(digest) => error(
            StatusCode::CONFLICT,
            format!("dataset {name:?} has no ready snapshot {digest}"),
        ),
        LeaseRefused::NotOwner { owner } => error(
            StatusCode::FORBIDDEN,
            format!("{holder:?}'s lease on {name:?} belongs to {owner}"),
        ),
        LeaseRefused::TooMany { cap } => error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("dataset {name:?} holds {cap} leases, the most the catalog allows to this caller (cache.max_leases_per_dataset; its last quarter is kept for admins)"),
        ),
        LeaseRefused::TooManyOfYours { cap } => error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{holder:?}: this identity holds {cap} leases on {name:?}, the most one identity may (cache.max_leases_per_identity)"),
        ),
        LeaseRefused::TooManyForPod { pod, cap } => error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{holder:?}: pod {pod} holds {cap} leases on {name:?}, the most one pod may (cache.max_leases_per_identity)"),
        ),
        LeaseRefused::NotHeld => error(
            StatusCode::NOT_FOUND,
            format!("{holder:?} holds no lease on {name:?}"),
        ),
    }
}

async fn leases(State(daemon): Shared, caller: Extension<Caller>) -> Response {
    let leases: Vec<_> = daemon
        .registry()
        .lease_statuses(registry::now_unix())
        .filter(|status| caller.may_use(&status.lease.dataset))
        .collect();
    Json(leases).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_body_means_defaults_and_junk_is_rejected() {
        let request: WarmRequest = body(&Bytes::from_static(b" \n")).unwrap();
        assert!(!request.wait);
        let junk = body::<WarmRequest>(&Bytes::from_static(b"{\"wait\": \"yes\"}"));
        assert_eq!(junk.unwrap_err().status(), StatusCode::BAD_REQUEST);
    }
}
