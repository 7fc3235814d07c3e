//! Operator-facing edges: CLI tools, metrics, latency export, systemd notification.

pub mod bench;
pub mod log_tools;
pub mod mirrors_cli;
