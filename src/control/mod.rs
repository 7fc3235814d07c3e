//! The control thread: mirror lifecycle, `__mirror_state`, discovery and sync.

pub mod mirror_run;
