//! A `/metrics`-only HTTP endpoint for `kmirror serve` without `[admin]` (the `[metrics]`
//! section): one thread running a current-thread tokio runtime with axum, rendering on demand.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::routing::get;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    #[error("cannot listen on {addr} for /metrics: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

/// The running endpoint; stops serving when dropped.
pub struct MetricsServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `render()` at `GET /metrics` on `addr`.
    pub fn start(
        addr: SocketAddr,
        render: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> Result<MetricsServer, MetricsServerError> {
        let bind_err = |source| MetricsServerError::Bind { addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
        let bound = listener.local_addr().map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kmirror-metrics".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return tracing::error!("metrics runtime: {e}"),
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::error!("metrics listener: {e}"),
                    };
                    let app = axum::Router::new().route(
                        "/metrics",
                        get(move || {
                            let text = render();
                            async move {
                                (
                                    [(
                                        axum::http::header::CONTENT_TYPE,
                                        crate::ops::metrics::CONTENT_TYPE,
                                    )],
                                    text,
                                )
                                    .into_response()
                            }
                        }),
                    );
                    let served = axum::serve(listener, app).with_graceful_shutdown(async {
                        let _ = rx.await;
                    });
                    if let Err(e) = served.await {
                        tracing::error!("metrics endpoint: {e}");
                    }
                });
            })
            .map_err(MetricsServerError::Thread)?;
        Ok(MetricsServer {
            addr: bound,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
