//! The admin routes of failback (`control::failback`): the controller is locked only to read
//! the failover points and to flip the copier's flags; `create`'s calls to the original and
//! `stop`'s wait for the cut-over run on their own threads, awaited without the lock.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::control::admin::{lock, ApiError, ApiResult, ErrorBody, SharedController};
use crate::control::controller::{ControlError, DataPlane, SourceCatalog};
use crate::control::failback::{self, FailbackError};
use crate::limits::{FAILBACK_CREATE_TIMEOUT_MS, FAILBACK_STOP_TIMEOUT_MS_DEFAULT};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FailbackBody {
    /// `create`: regexes of the mirror's topics to fail back.
    #[serde(default)]
    pub topics: Option<String>,
    /// `stop`: how long to wait for the copy to catch up and the groups to move.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

fn err(e: FailbackError) -> ApiError {
    ApiError(ControlError::Failback(e))
}

/// Runs `job` on a thread of its own and awaits it for at most `ms`.
async fn off_thread<T: Send + 'static>(
    name: &str,
    ms: u64,
    job: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(job());
        });
    if spawned.is_err() {
        return None;
    }
    match tokio::time::timeout(Duration::from_millis(ms), rx).await {
        Ok(Ok(v)) => Some(v),
        _ => None,
    }
}

pub(crate) async fn step<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path((name, step)): Path<(String, String)>,
    body: Option<Json<FailbackBody>>,
) -> ApiResult {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    match step.as_str() {
        "create" => {
            let topics = body.topics.as_deref().unwrap_or(".*").to_owned();
            let (def, points) = lock(&c).failback_inputs(&name, &topics).map_err(ApiError)?;
            let now = now_ms();
            let planned = off_thread(
                "kmirror-failback-plan",
                FAILBACK_CREATE_TIMEOUT_MS,
                move || failback::plan(&def, &points, now),
            )
            .await
            .ok_or_else(|| {
                err(FailbackError::Original(format!(
                    "no answer within {FAILBACK_CREATE_TIMEOUT_MS} ms"
                )))
            })?
            .map_err(err)?;
            let report = lock(&c).failback_create_finish(planned).map_err(ApiError)?;
            Ok((StatusCode::CREATED, Json(report)).into_response())
        }
        "start" => {
            let report = lock(&c).failback_start(&name).map_err(ApiError)?;
            Ok(Json(report).into_response())
        }
        "stop" => {
            let wait = lock(&c).failback_stop_begin(&name).map_err(ApiError)?;
            let ms = body.timeout_ms.unwrap_or(FAILBACK_STOP_TIMEOUT_MS_DEFAULT);
            let done = off_thread(
                "kmirror-failback-stop",
                ms.saturating_add(1_000),
                move || wait.wait(Duration::from_millis(ms)),
            )
            .await
            .unwrap_or(false);
            let report = lock(&c).failback_describe(&name).map_err(ApiError)?;
            if !done {
                return Ok((
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(ErrorBody {
                        error: format!(
                            "failback of mirror {name} not caught up within {ms} ms (stop producers on kmirror; the copy goes on, run stop again): {}",
                            report
                                .partitions
                                .iter()
                                .filter(|p| p.lag != Some(0))
                                .map(|p| format!("{}-{} lag {:?}", p.topic, p.partition, p.lag))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }),
                )
                    .into_response());
            }
            Ok(Json(report).into_response())
        }
        other => Ok((
            StatusCode::NOT_FOUND,
            Json(ErrorBody {
                error: format!("unknown failback step {other:?} (create, start or stop)"),
            }),
        )
            .into_response()),
    }
}

pub(crate) async fn describe<S: SourceCatalog, D: DataPlane>(
    State(c): State<SharedController<S, D>>,
    Path(name): Path<String>,
) -> Response {
    match lock(&c).failback_describe(&name) {
        Ok(r) => Json(r).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
