//! `kmirror serve` with an `[admin]` section: the control plane. The control thread opens the
//! data dir, starts the shards (their events wake the thread that started them, so they start
//! there), opens `__mirror_state`, hands the partitions that were mirroring back to the shards
//! and serves the admin API until asked to stop; then it closes `__mirror_state` and stops the
//! shards, which close every partition log with its checkpoints and the clean-shutdown marker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::ServeConfig;
use crate::control::admin::{self, AdminError};
use crate::control::controller::Controller;
use crate::control::shard_plane::ShardDataPlane;
use crate::control::source_catalog::BlockingSourceCatalog;
use crate::control::state::RetryPolicy;
use crate::control::state_log::StateLog;
use crate::limits::CONTROL_TICK_MS;
use crate::log::read_view::ReadCatalog;

/// Why the control plane could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ControlRunError {
    #[error("the configuration has no [admin] section")]
    NoAdmin,
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("Kafka listener: {0}")]
    Kafka(#[from] std::io::Error),
    #[error("closing: {0}")]
    Close(String),
}

/// Runs the control plane until `stop` is set (by SIGTERM/SIGINT in the binary).
pub fn run(config: &ServeConfig, stop: &AtomicBool) -> Result<(), ControlRunError> {
    let admin_section = config.admin.as_ref().ok_or(ControlRunError::NoAdmin)?;
    let listen = admin_section.listen;
    let sync_interval_ms = admin_section.sync_interval_ms;
    let data_dir = config.storage.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|source| ControlRunError::DataDir {
        path: data_dir.display().to_string(),
        source,
    })?;
    let runtime = config.runtime_config();
    let fetch = config.fetch_config();
    let catalog = ReadCatalog::new();
    let writer = crate::serve::writes::writer_slot();
    let kafka = crate::serve::start_configured(config, &catalog, &writer)?;
    let request_timeout_ms = config.fetch.request_timeout_ms;
    let build = move || {
        let mut plane = ShardDataPlane::start(&data_dir, &runtime, fetch, request_timeout_ms)
            .map_err(|e| e.to_string())?;
        plane.attach_read_catalog(catalog);
        // Failed-over partitions take client writes through the endpoint from now on.
        let leaders: std::sync::Arc<dyn crate::serve::writes::PartitionWriter> = plane.leaders();
        let _ = writer.set(leaders);
        let store = match StateLog::open(&data_dir) {
            Ok(s) => s,
            Err(e) => {
                // Leave the partition logs closed cleanly: nothing was fetched yet.
                let _ = plane.stop();
                return Err(e.to_string());
            }
        };
        let mut c = Controller::open(store, RetryPolicy::default(), BlockingSourceCatalog, plane)
            .map_err(|e| e.to_string())?;
        c.set_sync_interval_ms(sync_interval_ms);
        Ok(c)
    };
    let close = |c: Controller<BlockingSourceCatalog, ShardDataPlane>| {
        tracing::info!("stopping: closing __mirror_state and the partition logs");
        let plane = c.shutdown().map_err(|e| e.to_string())?;
        plane.stop().map_err(|e| e.to_string())
    };
    let control = admin::spawn_built(listen, build, close)?;
    tracing::info!(admin = %control.addr, "control plane serving");
    // Recovery ran and the shards started inside `spawn_built`; the control thread's tick
    // pings the watchdog from now on.
    crate::ops::sd_notify::ready("control plane serving");
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(CONTROL_TICK_MS.min(200)));
    }
    // No client reads a log once the control plane starts closing them.
    drop(kafka);
    crate::ops::sd_notify::stopping();
    control.finish().map_err(ControlRunError::Close)
}
