//! `kmirror serve` with an `[admin]` section: the control plane. The control thread opens the
//! data dir, starts the shards (their events wake the thread that started them, so they start
//! there), opens `__mirror_state`, hands the partitions that were mirroring back to the shards
//! and serves the admin API until asked to stop; then it closes `__mirror_state` and stops the
//! shards, which close every partition log with its checkpoints and the clean-shutdown marker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::ServeConfig;
use crate::control::admin::{self, AdminError};
use crate::control::controller::DataPlane as _;
use crate::control::controller::{AclSyncPlane, Controller, GroupSyncPlane};
use crate::control::group_sync::{BlockingSourceGroups, GroupSyncSchedule};
use crate::control::shard_plane::ShardDataPlane;
use crate::control::source_catalog::BlockingSourceCatalog;
use crate::control::state::RetryPolicy;
use crate::control::state_log::StateLog;
use crate::limits::{CONTROL_TICK_MS, SHARD_FAILURE_EXIT_DELAY_MS};
use crate::log::read_view::ReadCatalog;
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::groups::GroupService;
use crate::serve::request_stats::RequestStats;
use crate::serve::txn::TxnService;

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
    #[error("opening the ACLs: {0}")]
    Authz(String),
    #[error("{0}; exited for a restart (the next start recovers its partitions)")]
    ShardFailed(String),
}

/// Runs the control plane until `stop` is set (by SIGTERM/SIGINT in the binary).
pub fn run(config: &ServeConfig, stop: &AtomicBool) -> Result<(), ControlRunError> {
    let admin_section = config.admin.as_ref().ok_or(ControlRunError::NoAdmin)?;
    let endpoint = admin_section
        .endpoint()
        .map_err(crate::control::admin::AdminError::from)?;
    let sync_interval_ms = admin_section.sync_interval_ms;
    let retention_every = Duration::from_millis(admin_section.retention_check_interval_ms);
    let checkpoint_every = Duration::from_millis(config.storage.recovery_checkpoint_interval_ms);
    let data_dir = config.storage.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|source| ControlRunError::DataDir {
        path: data_dir.display().to_string(),
        source,
    })?;
    let runtime = config.runtime_config();
    let fetch = config.fetch_config();
    // ACLs: kept in their own directory, which the partition scan skips, so they can be
    // opened before the shards; the controller puts each mirror's synced ACLs in force.
    let authz = crate::serve::authz::open_configured(config, &data_dir)
        .map_err(|e| ControlRunError::Authz(e.to_string()))?;
    let catalog = ReadCatalog::new();
    let writer = crate::serve::writes::writer_slot();
    // Consumer groups come with the Kafka endpoint. The service is opened on the control
    // thread once the shard plane has opened the data dir without `__consumer_offsets-0`
    // (so the coordinator is that log's only opener), and handed back here for the listener.
    let serve_groups = config.kafka.is_some();
    let rebalance_delay_ms = config.kafka.as_ref().map_or(
        crate::limits::GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT,
        |k| k.group_initial_rebalance_delay_ms,
    );
    let groups_slot: Arc<OnceLock<Arc<GroupService>>> = Arc::default();
    let build_catalog = Arc::clone(&catalog);
    let build_writer = Arc::clone(&writer);
    let build_groups = Arc::clone(&groups_slot);
    // Transactions after failover: the coordinator is opened once the controller has put the
    // failed-over partitions back into the leader store, so prepared transactions can finish.
    let txn_slot: Arc<OnceLock<Arc<TxnService>>> = Arc::default();
    let build_txn = Arc::clone(&txn_slot);
    let build_authz = Arc::clone(&authz);
    let request_timeout_ms = config.fetch.request_timeout_ms;
    // The endpoint's fetch sessions: served by the listener, counted in the admin `/metrics`.
    let fetch_sessions = FetchSessions::new();
    let build_sessions = Arc::clone(&fetch_sessions);
    let endpoint_requests = RequestStats::new();
    let build_requests = Arc::clone(&endpoint_requests);
    // Set by the shard plane with the reason once a shard panicked or stalled.
    let shard_failed: Arc<OnceLock<String>> = Arc::default();
    let build_failed = Arc::clone(&shard_failed);
    let build = move || {
        let mut plane = ShardDataPlane::start(&data_dir, &runtime, fetch, request_timeout_ms)
            .map_err(|e| e.to_string())?;
        plane.report_shard_failure_to(build_failed);
        plane.set_recovery_checkpoint_interval(checkpoint_every);
        if serve_groups {
            if let Some(t) = plane.telemetry() {
                t.attach_fetch_sessions(build_sessions);
                t.attach_endpoint_requests(build_requests);
            }
        }
        plane.attach_read_catalog(Arc::clone(&build_catalog));
        plane.set_retention_check_interval(retention_every);
        // Failed-over partitions take client writes through the endpoint from now on.
        let leaders: Arc<dyn crate::serve::writes::PartitionWriter> = plane.leaders();
        let _ = build_writer.set(leaders);
        let groups = if serve_groups {
            match GroupService::open_with(&data_dir, Arc::clone(&build_catalog), rebalance_delay_ms)
            {
                Ok(g) => Some(g),
                Err(e) => {
                    let _ = plane.stop();
                    return Err(e.to_string());
                }
            }
        } else {
            None
        };
        let store = match StateLog::open(&data_dir) {
            Ok(s) => s,
            Err(e) => {
                // Leave the partition logs closed cleanly: nothing was fetched yet.
                if let Some(g) = groups {
                    let _ = g.close();
                }
                let _ = plane.stop();
                return Err(e.to_string());
            }
        };
        let mut c = Controller::open(store, RetryPolicy::default(), BlockingSourceCatalog, plane)
            .map_err(|e| e.to_string())?;
        if let Some(g) = &groups {
            let leaders: Arc<dyn crate::serve::writes::PartitionWriter> = c.data_plane().leaders();
            match TxnService::open(&data_dir, leaders, Arc::clone(g)) {
                Ok(t) => {
                    let _ = build_txn.set(t);
                }
                Err(e) => {
                    if let Some(g) = groups {
                        let _ = g.close();
                    }
                    let _ = c.shutdown().map(|p| p.stop());
                    return Err(e.to_string());
                }
            }
        }
        c.set_sync_interval_ms(sync_interval_ms);
        c.set_source_timeout_ms(u64::from(request_timeout_ms));
        // Integrity audit of every mirror (`mirror.audit.*`), its marks under the data dir.
        match crate::control::audit::AuditPlane::open(&data_dir, Arc::clone(&build_catalog)) {
            Ok(audit) => {
                if let Some(t) = c.data_plane().telemetry() {
                    t.attach_audit(audit.board());
                }
                c.attach_audit(audit);
            }
            Err(e) => tracing::error!("integrity audit not started: {e}"),
        }
        // ACL sync from each mirror's source into the authorizer the endpoint enforces; the
        // synced ACLs `__mirror_state` holds are in force from here, before the listener.
        if build_authz.enabled() {
            c.attach_acl_sync(AclSyncPlane {
                authz: Arc::clone(&build_authz),
                source: Arc::new(crate::control::acl_sync::BlockingSourceAcls),
            });
        }
        // Failback to the original clusters (`control::failback`): copiers that were copying
        // before a restart resume here.
        c.attach_failback(crate::control::failback::FailbackPlane::open(
            &data_dir,
            Arc::clone(&build_catalog),
            groups.as_ref().map(|g| Arc::clone(g.coordinator())),
        ));
        if let Some(g) = groups {
            // Group-offset sync from each mirror's source, on the controller's tick, into the
            // coordinator the endpoint serves (kip1279.md §8).
            c.attach_group_sync(GroupSyncPlane {
                source: Arc::new(BlockingSourceGroups),
                local: Box::new(Arc::clone(&build_catalog)),
                sink: Box::new(Arc::clone(g.coordinator())),
                schedule: GroupSyncSchedule::default(),
            });
            let _ = build_groups.set(g);
        }
        Ok(c)
    };
    let close = |c: Controller<BlockingSourceCatalog, ShardDataPlane>| {
        tracing::info!("stopping: closing __mirror_state and the partition logs");
        let plane = c.shutdown().map_err(|e| e.to_string())?;
        plane.stop().map_err(|e| e.to_string())
    };
    let control = admin::spawn_built(&endpoint, build, close)?;
    let groups = groups_slot.get().cloned();
    let txn = txn_slot.get().cloned();
    let kafka = match crate::serve::start_configured(
        config,
        &catalog,
        &writer,
        groups.as_ref(),
        txn.as_ref(),
        &fetch_sessions,
        &endpoint_requests,
        &authz,
    ) {
        Ok(k) => k,
        Err(e) => {
            let _ = control.finish();
            if let Some(t) = &txn {
                let _ = t.close();
            }
            if let Some(g) = groups {
                let _ = g.close();
            }
            return Err(ControlRunError::Kafka(e));
        }
    };
    tracing::info!(admin = %control.addr, "control plane serving");
    // Recovery ran and the shards started inside `spawn_built`; the control thread's tick
    // pings the watchdog from now on.
    crate::ops::sd_notify::ready("control plane serving");
    while !stop.load(Ordering::Relaxed) && shard_failed.get().is_none() {
        std::thread::sleep(Duration::from_millis(CONTROL_TICK_MS.min(200)));
    }
    if let Some(why) = shard_failed.get() {
        // A shard is not restarted in place: its partitions' logs died with it. Describe and
        // /metrics show the FAILED partitions a little longer, then the process exits non-zero
        // and systemd restarts it; that start recovers the logs.
        tracing::error!(%why, delay_ms = SHARD_FAILURE_EXIT_DELAY_MS, "a shard failed; exiting");
        let until = std::time::Instant::now() + Duration::from_millis(SHARD_FAILURE_EXIT_DELAY_MS);
        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // No client reads a log once the control plane starts closing them.
    drop(kafka);
    crate::ops::sd_notify::stopping();
    // The transaction coordinator writes markers into the leader store's logs: closed before
    // the controller hands them back to the log dir.
    if let Some(t) = &txn {
        if let Err(e) = t.close() {
            tracing::warn!("closing __transaction_state-0: {e}");
        }
    }
    let finished = control.finish().map_err(ControlRunError::Close);
    // After the controller: its group sync held the coordinator until now.
    if let Some(g) = groups {
        if let Err(e) = g.close() {
            tracing::warn!("closing __consumer_offsets-0: {e}");
        }
    }
    if let Err(e) = authz.close() {
        tracing::warn!("closing the ACL log: {e}");
    }
    match shard_failed.get() {
        Some(why) => {
            if let Err(e) = finished {
                tracing::error!("closing after the shard failure: {e}");
            }
            Err(ControlRunError::ShardFailed(why.clone()))
        }
        None => finished,
    }
}
