//! The admin API: HTTP/JSON, served by the control thread: on loopback by default; with a
//! bearer token (`admin_guard`) on any address, and optionally over TLS (`admin_tls`).
//!
//! The control thread is an ordinary thread running a tokio current-thread runtime (never a
//! shard core). It owns the `Controller`; each handler locks it only for work that never waits
//! on a source, so `/metrics`, `describe` and `list` answer while a source is black-holed.
//! A command that needs the source (`create`'s check, `start`'s metadata, `check_source`,
//! `--promote`'s ListOffsets, `stop`'s last group sync) takes the controller's ask, releases
//! the lock, awaits the answer of a source worker (`control::source_worker`) with the call's
//! deadline, and locks again to finish: 504 "did not answer within N ms" when it passes.
//!
//! | method | path                          | body                                   |
//! |--------|-------------------------------|----------------------------------------|
//! | GET    | /mirrors                      | -                                      |
//! | POST   | /mirrors                      | `{"name", "properties": {k: v}}`       |
//! | DELETE | /mirrors/{name}               | -                                      |
//! | POST   | /mirrors/{name}/start         | `{"topics", "exclude"?}`               |
//! | POST   | /mirrors/{name}/pause, resume, stop | `{"topics"}`                     |
//! | POST   | /mirrors/{name}/promote       | `{"topics"}`: stop if caught up, else 503 |
//! | GET    | /mirrors/{name}/source        | - (connects with the mirror's settings)|
//! | GET    | /mirrors/{name}/audit         | - (integrity audit report)             |

//! | GET    | /mirrors/{name}/loss-report   | - (the stored loss reports of its stops) |
//! | GET    | /mirrors/{name}/failback      | - (the failback's report, `admin_failback`) |
//! | POST   | /mirrors/{name}/failback/{create,start,stop} | `{"topics"?, "timeout_ms"?}` |
//! | GET, POST | /drills                    | POST `{"name", "mirror", "topics"}`: start a drill |
//! | DELETE | /drills/{name}                | - (stop the drill, delete its clones)  |
//! | GET    | /describe?mirror=NAME         | -                                      |
//! | GET    | /metrics                      | - (Prometheus text format)             |
//!
//! Errors answer `{"error": "..."}` with 400 (bad input), 404 (unknown mirror or no match),
//! 409 (not allowed in the current state), 502 (source unreachable or changed), 503 (the same
//! source call is still waiting for its answer), 504 (the source did not answer in time).

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::control::admin_guard::{AdminEndpoint, AdminGuard, GuardError};
use crate::control::controller::{
    ControlError, Controller, DataPlane, LossListing, SourceAsk, SourceCatalog,
};
use crate::control::source_worker::SourceWorkers;
use crate::control::state::Command;
use crate::limits::CONTROL_TICK_MS;

/// The controller as the admin API holds it.
pub type SharedController<S, D> = Arc<Mutex<Controller<S, D>>>;

#[derive(Debug, Serialize, Deserialize)]
pub struct CreateBody {
    pub name: String,
    pub properties: BTreeMap<String, String>,
}

/// `POST /mirrors/{name}/repoint`: the mirror's new source connection properties.
#[derive(Debug, Serialize, Deserialize)]
pub struct RepointBody {
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TopicsBody {
    pub topics: String,
    #[serde(default)]
    pub exclude: Option<String>,
    /// `stop`: refuse the failover when it may lose more than this many seconds of records
    /// (see `control::loss_report`), unless `force`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loss_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// `stop`: cut every partition failed over to this source timestamp (ms), the rest to the
    /// quarantine (`control::consistent_cut`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_at_timestamp: Option<i64>,
}

/// `stop`'s answer: what changed, and the loss report of the partitions it failed over.
#[derive(Debug, Serialize, Deserialize)]
pub struct StopAnswer {
    #[serde(flatten)]
    pub report: crate::control::controller::CommandReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_report: Option<crate::control::loss_report::LossReport>,
    /// Why the loss report could not be stored (it is still in this answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_report_error: Option<String>,
    /// `--cut-at-timestamp`: each partition's cut and what went to the quarantine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<crate::control::consistent_cut::CutReport>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Debug, Deserialize)]
struct DescribeQuery {
    mirror: Option<String>,
}

pub(crate) struct ApiError(pub(crate) ControlError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            Json(ErrorBody {
                error: self.0.to_string(),
            }),
        )
            .into_response()
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) fn lock<S, D>(
    c: &SharedController<S, D>,
) -> std::sync::MutexGuard<'_, Controller<S, D>> {
    // A handler that panicked left the controller as it was after its last persisted change.
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// The admin routes over a controller, with no access rule (see `guarded_router`).
pub fn router<S, D>(controller: SharedController<S, D>) -> Router
where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
{
    guarded_router(controller, AdminGuard::open(&[]))
}

/// The admin routes behind `guard` (token and Host check on every route, `/metrics` too).
pub fn guarded_router<S, D>(controller: SharedController<S, D>, guard: AdminGuard) -> Router
where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
{
    Router::new()
        .route("/mirrors", get(list::<S, D>).post(create::<S, D>))
        .route("/mirrors/{name}", axum::routing::delete(delete::<S, D>))
        .route("/mirrors/{name}/{action}", post(action::<S, D>))
        .route("/mirrors/{name}/repoint", post(repoint::<S, D>))
        .route("/mirrors/{name}/source", get(check_source::<S, D>))
        .route("/mirrors/{name}/audit", get(audit_report::<S, D>))
        .route("/mirrors/{name}/loss-report", get(loss_reports::<S, D>))
        .route(
            "/mirrors/{name}/failback",
            get(crate::control::admin_failback::describe::<S, D>),
        )
        .route(
            "/mirrors/{name}/failback/{step}",
            post(crate::control::admin_failback::step::<S, D>),
        )
        .route("/drills", get(drills::<S, D>).post(drill_start::<S, D>))
        .route("/drills/{name}", axum::routing::delete(drill_stop::<S, D>))
        .route("/describe", get(describe::<S, D>))
        .route("/metrics", get(metrics::<S, D>))
        .with_state(controller)
        .layer(axum::middleware::from_fn_with_state(
            guard,
            crate::control::admin_guard::check,
        ))
}

async fn list<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
) -> ApiResult {
    Ok(Json(lock(&c).list()).into_response())
}

/// Runs `ask` on a source worker and awaits its answer without holding the controller:
/// `None` when the deadline passed first (the worker's own deadline ends the call soon after).
async fn answer_of<T: Send + 'static>(
    workers: &SourceWorkers,
    mirror: &str,
    ask: SourceAsk<T>,
) -> Result<Option<T>, ApiError> {
    let ms = ask.timeout_ms;
    let rx = ask.spawn(workers).map_err(|busy| {
        ApiError(ControlError::SourceBusy {
            mirror: mirror.to_owned(),
            reason: busy.to_string(),
        })
    })?;
    // A little past the call's own deadline: the worker's answer (its timeout) comes first.
    let wait = Duration::from_millis(ms.saturating_add(ANSWER_GRACE_MS));
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok(answer)) => Ok(Some(answer)),
        // The worker ended without answering (it panicked): as if it timed out.
        Ok(Err(_)) | Err(_) => Ok(None),
    }
}

/// How long past a source call's deadline a handler waits for the worker's answer.
const ANSWER_GRACE_MS: u64 = 500;

fn no_answer(mirror: &str, ms: u64) -> ApiError {
    ApiError(ControlError::SourceTimeout {
        mirror: mirror.to_owned(),
        ms,
        reason: "no answer from the source worker".to_owned(),
    })
}

async fn create<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Json(body): Json<CreateBody>,
) -> ApiResult {
    let (def, ask, workers) = {
        let c = lock(&c);
        let (def, ask) = c
            .create_ask(&body.name, &body.properties)
            .map_err(ApiError)?;
        (def, ask, c.workers().clone())
    };
    let ms = ask.timeout_ms;
    let view = answer_of(&workers, &body.name, ask)
        .await?
        .ok_or_else(|| no_answer(&body.name, ms))?;
    let summary = lock(&c).create_finish(def, view).map_err(ApiError)?;
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

/// `repoint`: the history check runs on a source worker; the controller is held only to read
/// our tails and to apply the answer (`controller/repoint.rs`).
async fn repoint<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
    Json(body): Json<RepointBody>,
) -> ApiResult {
    let (plan, ask, workers) = {
        let c = lock(&c);
        let (plan, ask) = c.repoint_ask(&name, &body.properties).map_err(ApiError)?;
        (plan, ask, c.workers().clone())
    };
    let ms = ask.timeout_ms;
    let answer = answer_of(&workers, &name, ask)
        .await?
        .ok_or_else(|| no_answer(&name, ms))?;
    let report = lock(&c).repoint_finish(plan, answer).map_err(ApiError)?;
    Ok(Json(report).into_response())
}

async fn delete<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> ApiResult {
    lock(&c).delete(&name).map_err(ApiError)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn action<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path((name, action)): Path<(String, String)>,
    Json(body): Json<TopicsBody>,
) -> ApiResult {
    let report = match action.as_str() {
        "start" => {
            let (plan, ask, workers) = {
                let c = lock(&c);
                let (plan, ask) = c
                    .start_ask(&name, &body.topics, body.exclude.as_deref())
                    .map_err(ApiError)?;
                (plan, ask, c.workers().clone())
            };
            let ms = ask.timeout_ms;
            let answer = answer_of(&workers, &name, ask)
                .await?
                .ok_or_else(|| no_answer(&name, ms))?;
            lock(&c).start_finish(plan, answer)
        }
        "pause" => lock(&c).command(&name, &body.topics, Command::Pause),
        "resume" => lock(&c).command(&name, &body.topics, Command::Resume),
        "stop" => {
            let answer = stop(&c, &name, &body).await.map_err(ApiError)?;
            return Ok(Json(answer).into_response());
        }
        "promote" => {
            let (plan, ask, workers) = {
                let c = lock(&c);
                let (plan, ask) = c.promote_ask(&name, &body.topics).map_err(ApiError)?;
                (plan, ask, c.workers().clone())
            };
            let listed = match ask {
                Some(ask) => {
                    let ms = ask.timeout_ms;
                    Some(
                        answer_of(&workers, &name, ask)
                            .await?
                            .ok_or_else(|| no_answer(&name, ms))?,
                    )
                }
                None => None,
            };
            let checked = lock(&c).promote_check(&plan, listed);
            match checked {
                Ok(()) => stop(&c, &name, &body).await.map(|a| a.report),
                Err(e) => Err(e),
            }
        }
        other => {
            return Ok((
                StatusCode::NOT_FOUND,
                Json(ErrorBody {
                    error: format!(
                        "unknown action {other:?} (start, pause, resume, stop or promote)"
                    ),
                }),
            )
                .into_response())
        }
    }
    .map_err(ApiError)?;
    Ok(Json(report).into_response())
}

/// `stop`: the partitions go STOPPING at once; the last group sync runs on a worker, awaited
/// for at most the mirror's `sync.group.offsets.final.timeout.ms` (skipped and reported so
/// when the source does not answer); then they fail over. Beside the group sync a ListOffsets
/// on another worker (same deadline) says what the source holds, for the loss report; with
/// `max_loss_seconds` it is awaited first and the stop refused (nothing changed) when the
/// failover may lose more, unless `force`.
async fn stop<S: SourceCatalog, D: DataPlane>(
    c: &SharedController<S, D>,
    name: &str,
    body: &TopicsBody,
) -> Result<StopAnswer, ControlError> {
    let topics = body.topics.as_str();
    let (plan, loss_ask, workers) = {
        let c = lock(c);
        let (plan, ask) = c.loss_ask(name, topics)?;
        (plan, ask, c.workers().clone())
    };
    let mut pending = loss_ask.map(|ask| {
        let ms = ask.timeout_ms;
        (ask.spawn(&workers), ms)
    });
    let mut listing: Option<Option<LossListing>> = None;
    let mut listed_at = 0;
    if let Some(max) = body.max_loss_seconds {
        let answer = await_listing(pending.take()).await;
        listed_at = now_ms();
        let preview = lock(c).loss_estimate(&plan, answer.as_ref(), listed_at);
        if !body.force {
            Controller::<S, D>::loss_check(&preview, max)?;
        }
        listing = Some(answer);
    }
    let (report, last) = {
        let mut c = lock(c);
        if let Some(ts) = body.cut_at_timestamp {
            c.cut_begin(name, crate::ids::TimestampMs(ts))?;
        }
        let begun = c.command_begin(name, topics, Command::Stop);
        if begun.is_err() && body.cut_at_timestamp.is_some() {
            c.cut_finish(name);
        }
        begun?
    };
    let report = match last {
        None => report,
        Some(mut last) => {
            let answer = match last.ask.take() {
                Some(ask) => match answer_of(&workers, name, ask).await {
                    Ok(answer) => answer,
                    // The same read is still in flight from an earlier stop: skipped, reported.
                    Err(ApiError(e)) => {
                        Some(Err(crate::control::group_sync::GroupSyncError::Source {
                            mirror: name.to_owned(),
                            reason: e.to_string(),
                        }))
                    }
                },
                None => None,
            };
            let finished = lock(c).command_finish(report, last, answer);
            if finished.is_err() && body.cut_at_timestamp.is_some() {
                // The cut stays for the partitions still STOPPING; the tick ends it.
                lock(c).cut_finish(name);
            }
            finished?
        }
    };
    let cut = if body.cut_at_timestamp.is_some() {
        lock(c).cut_finish(name)
    } else {
        Vec::new()
    };
    if listing.is_none() {
        let answer = await_listing(pending.take()).await;
        listed_at = now_ms();
        listing = Some(answer);
    }
    if plan.is_empty() {
        return Ok(StopAnswer {
            report,
            loss_report: None,
            loss_report_error: None,
            cut,
        });
    }
    let c = lock(c);
    let mut loss = c.loss_estimate(&plan, listing.flatten().as_ref(), listed_at);
    loss.max_loss_seconds = body.max_loss_seconds;
    loss.forced = body.force;
    let loss_report_error = c.loss_record(&loss).err();
    if let Some(why) = &loss_report_error {
        tracing::error!(mirror = %name, %why, "stop: loss report not stored");
    }
    Ok(StopAnswer {
        report,
        loss_report: Some(loss),
        loss_report_error,
        cut,
    })
}

/// The loss listing's answer: `None` when the worker could not start (the same listing is still
/// in flight), died, or the deadline passed.
async fn await_listing(
    pending: Option<(
        Result<tokio::sync::oneshot::Receiver<LossListing>, crate::control::source_worker::Busy>,
        u64,
    )>,
) -> Option<LossListing> {
    let (rx, ms) = pending?;
    let rx = rx.ok()?;
    let wait = Duration::from_millis(ms.saturating_add(ANSWER_GRACE_MS));
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(_)) | Err(_) => None,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `mirrors drill start`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DrillBody {
    pub name: String,
    pub mirror: String,
    pub topics: String,
}

async fn drill_start<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Json(body): Json<DrillBody>,
) -> ApiResult {
    let summary = lock(&c)
        .drill_start(&body.name, &body.mirror, &body.topics)
        .map_err(ApiError)?;
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

async fn drill_stop<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> ApiResult {
    let summary = lock(&c).drill_stop(&name).map_err(ApiError)?;
    Ok(Json(summary).into_response())
}

async fn drills<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
) -> ApiResult {
    Ok(Json(lock(&c).drills()).into_response())
}

/// `kmirror mirrors loss-report`: every stored report of a mirror, oldest first.
async fn loss_reports<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> ApiResult {
    let reports = lock(&c).loss_reports(&name).map_err(ApiError)?;
    Ok(Json(reports).into_response())
}

/// `kmirror doctor` asks kmirror to connect with the mirror's own credentials, which the admin
/// API never hands out.
async fn check_source<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> ApiResult {
    let (def, ask, workers) = {
        let c = lock(&c);
        let (def, ask) = c.check_source_ask(&name).map_err(ApiError)?;
        (def, ask, c.workers().clone())
    };
    let ms = ask.timeout_ms;
    let outcome = answer_of(&workers, &name, ask).await?.unwrap_or_else(|| {
        Err(crate::control::fault::Fault::timed_out(
            &def.source.bootstrap_servers.join(","),
            ms,
        ))
    });
    let check = Controller::<S, D>::source_check(&def, outcome);
    Ok(Json(check).into_response())
}

async fn describe<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Query(q): Query<DescribeQuery>,
) -> ApiResult {
    let rows = lock(&c).describe(q.mirror.as_deref()).map_err(ApiError)?;
    Ok(Json(rows).into_response())
}

/// `kmirror audit report`: verified marks, audit bytes and the events kept.
async fn audit_report<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> ApiResult {
    let report = lock(&c).audit_report(&name).map_err(ApiError)?;
    Ok(Json(report).into_response())
}

async fn metrics<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
) -> Response {
    let text = {
        let c = lock(&c);
        let states = c
            .partition_states()
            .into_iter()
            .map(|(mirror, tp, state)| {
                let unclean = c.data_plane().progress(&tp).unclean;
                crate::ops::metrics::PartitionState {
                    tp,
                    mirror: mirror.to_string(),
                    state,
                    unclean_truncations: unclean.count,
                    quarantined_records: unclean.quarantined_records,
                }
            })
            .collect();
        let none;
        let telemetry = match c.data_plane().telemetry() {
            Some(t) => t.as_ref(),
            None => {
                none = crate::ops::telemetry::Telemetry::new(Vec::new());
                &none
            }
        };
        let control = crate::ops::metrics::ControlMetrics {
            failback: c.failback_metrics(),
            state_writes: Some(c.state_writes()),
        };
        crate::ops::metrics::render_with_control(telemetry, states, "", control)
    };
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::ops::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

/// Why the admin API could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "admin address {0} is not a loopback address: set [admin] token_file (and preferably \
         tls_cert_file/tls_key_file) to serve the API beyond this host"
    )]
    NotLoopback(SocketAddr),
    #[error("{0}")]
    Guard(#[from] GuardError),
    #[error("admin API TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the control thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot start the controller: {0}")]
    Build(String),
}

/// The running control thread.
pub struct ControlThread {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl ControlThread {
    /// Stops serving and joins the thread.
    pub fn stop(mut self) {
        let _ = self.shutdown_now();
    }

    /// Stops serving, joins the thread and returns what its closing step reported.
    pub fn finish(mut self) -> Result<(), String> {
        self.shutdown_now()
    }

    fn shutdown_now(&mut self) -> Result<(), String> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err("the control thread panicked".to_owned())),
            None => Ok(()),
        }
    }
}

impl Drop for ControlThread {
    fn drop(&mut self) {
        let _ = self.shutdown_now();
    }
}

/// Binds `addr` (loopback, no token) and serves the admin API on a new control thread, which
/// also runs the controller's periodic tick.
pub fn spawn<S, D>(
    addr: SocketAddr,
    controller: SharedController<S, D>,
) -> Result<ControlThread, AdminError>
where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
{
    spawn_on(&AdminEndpoint::loopback(addr), controller)
}

/// `spawn` on `endpoint`: its address, access rules and TLS.
pub fn spawn_on<S, D>(
    endpoint: &AdminEndpoint,
    controller: SharedController<S, D>,
) -> Result<ControlThread, AdminError>
where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
{
    let (std_listener, bound) = bind(endpoint)?;
    let serving = Serving::of(endpoint)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("kmirror-control".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("control thread runtime: {e}"))?;
            rt.block_on(serve_loop(std_listener, serving, controller, rx));
            Ok(())
        })
        .map_err(AdminError::Thread)?;
    Ok(ControlThread {
        addr: bound,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// How the API is served once bound: its access rules, and TLS when configured.
struct Serving {
    guard: AdminGuard,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Serving {
    fn of(endpoint: &AdminEndpoint) -> Result<Serving, AdminError> {
        let tls = match &endpoint.tls {
            Some((cert, key)) => {
                Some(crate::control::admin_tls::server_config(cert, key).map_err(AdminError::Tls)?)
            }
            None => None,
        };
        Ok(Serving {
            guard: endpoint.guard.clone(),
            tls,
        })
    }
}

fn bind(endpoint: &AdminEndpoint) -> Result<(std::net::TcpListener, SocketAddr), AdminError> {
    let addr = endpoint.addr;
    // Beyond loopback, anyone who can reach the port would own the mirrors.
    if !addr.ip().is_loopback() && !endpoint.guard.requires_token() {
        return Err(AdminError::NotLoopback(addr));
    }
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|source| AdminError::Bind { addr, source })?;
    let bound = std_listener
        .local_addr()
        .map_err(|source| AdminError::Bind { addr, source })?;
    std_listener
        .set_nonblocking(true)
        .map_err(|source| AdminError::Bind { addr, source })?;
    Ok((std_listener, bound))
}

/// Serves the admin API and ticks the controller until `shutdown` fires.
async fn serve_loop<S, D>(
    std_listener: std::net::TcpListener,
    serving: Serving,
    controller: SharedController<S, D>,
    shutdown: tokio::sync::oneshot::Receiver<()>,
) where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
{
    let listener = match tokio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("admin listener: {e}");
            return;
        }
    };
    let ticker = Arc::clone(&controller);
    let mut watchdog = crate::ops::sd_notify::Watchdog::from_env();
    // A source worker's answer wakes the tick at once instead of at the next period.
    let answered = Arc::new(tokio::sync::Notify::new());
    {
        let answered = Arc::clone(&answered);
        lock(&controller)
            .workers()
            .set_wake(move || answered.notify_one());
    }
    let tick = async move {
        let mut interval = tokio::time::interval(Duration::from_millis(CONTROL_TICK_MS));
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = answered.notified() => {}
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            if let Err(e) = lock(&ticker).tick(now) {
                tracing::error!("control tick: {e}");
            }
            // The tick got the controller and ran: the control thread is alive.
            watchdog.ping();
        }
    };
    // Shutdown: stop accepting, let requests that need no source finish, and drop after
    // `SHUTDOWN_GRACE_MS` those still awaiting a source worker (SIGTERM never waits on a
    // source; the workers end at their own deadlines, holding nothing of the controller).
    let (down_tx, down_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = shutdown.await;
        let _ = down_tx.send(true);
    });
    let mut graceful = down_rx.clone();
    let app = guarded_router(controller, serving.guard);
    let graceful = async move {
        let _ = graceful.wait_for(|down| *down).await;
    };
    let serve: std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>> =
        match serving.tls {
            None => Box::pin(
                axum::serve(listener, app)
                    .with_graceful_shutdown(graceful)
                    .into_future(),
            ),
            Some(config) => match crate::control::admin_tls::TlsListener::new(listener, config) {
                Ok(tls) => Box::pin(
                    axum::serve(tls, app)
                        .with_graceful_shutdown(graceful)
                        .into_future(),
                ),
                Err(e) => {
                    tracing::error!("admin API TLS listener: {e}");
                    return;
                }
            },
        };
    let mut cutoff_rx = down_rx;
    let cutoff = async move {
        if cutoff_rx.wait_for(|down| *down).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(SHUTDOWN_GRACE_MS)).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = serve => if let Err(e) = r { tracing::error!("admin API: {e}") },
        () = tick => {}
        () = cutoff => tracing::warn!("admin API: requests still waiting for a source dropped at shutdown"),
    }
}

/// How long shutdown lets admin requests in progress finish.
const SHUTDOWN_GRACE_MS: u64 = 1_000;

/// Like [`spawn`], but the controller is built on the control thread itself by `build` (the
/// shards' events wake the thread that started them, so the data plane must start there), and
/// `close` gets it back on that thread after the API stopped serving. Returns once `build` has
/// finished; its error is returned here.
pub fn spawn_built<S, D, B, C>(
    endpoint: &AdminEndpoint,
    build: B,
    close: C,
) -> Result<ControlThread, AdminError>
where
    S: SourceCatalog + Send + 'static,
    D: DataPlane + Send + 'static,
    B: FnOnce() -> Result<Controller<S, D>, String> + Send + 'static,
    C: FnOnce(Controller<S, D>) -> Result<(), String> + Send + 'static,
{
    let (std_listener, bound) = bind(endpoint)?;
    let serving = Serving::of(endpoint)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (built_tx, built_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name("kmirror-control".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = built_tx.send(Err(format!("control thread runtime: {e}")));
                    return Ok(());
                }
            };
            let controller = match build() {
                Ok(c) => Arc::new(Mutex::new(c)),
                Err(e) => {
                    let _ = built_tx.send(Err(e));
                    return Ok(());
                }
            };
            let _ = built_tx.send(Ok(()));
            rt.block_on(serve_loop(
                std_listener,
                serving,
                Arc::clone(&controller),
                rx,
            ));
            // The router and the tick are gone with the runtime's tasks; this is the last holder.
            drop(rt);
            let controller = Arc::try_unwrap(controller)
                .map_err(|_| "the controller is still shared after the API stopped".to_owned())?
                .into_inner()
                .unwrap_or_else(|p| p.into_inner());
            close(controller)
        })
        .map_err(AdminError::Thread)?;
    let mut control = ControlThread {
        addr: bound,
        shutdown: Some(tx),
        thread: Some(thread),
    };
    match built_rx.recv() {
        Ok(Ok(())) => Ok(control),
        Ok(Err(e)) => {
            let _ = control.shutdown_now();
            Err(AdminError::Build(e))
        }
        Err(_) => Err(AdminError::Build(
            control
                .shutdown_now()
                .err()
                .unwrap_or_else(|| "the control thread ended while starting".to_owned()),
        )),
    }
}
