//! Operator-facing edges: CLI tools, metrics, latency export, systemd notification.

pub mod admin_client;
pub mod audit_cli;
pub mod doctor;
pub mod latency;
pub mod latency_cmd;
pub mod latency_plot;
pub mod log_tools;
pub mod metrics;
pub mod metrics_server;
pub mod mirrors_cli;
pub mod process_stats;
pub mod sd_notify;
pub mod telemetry;
