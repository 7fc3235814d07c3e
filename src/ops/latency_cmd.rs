//! `kmirror latency`: reads an interval log, prints its table and optionally plots it.
//! It lives apart from `latency` (reading and merging) and `latency_plot` (drawing) so that
//! the plot depends on the merged data and nothing depends back on the plot.

use std::io::Write;
use std::path::Path;

use crate::ops::latency::{print_table, read_file, LatencyError};

/// `kmirror latency FILE [--plot OUT]`.
pub fn run(file: &Path, plot: Option<&Path>, out: &mut impl Write) -> Result<(), LatencyError> {
    let merged = read_file(file)?;
    print_table(&merged, out)?;
    if let Some(p) = plot {
        crate::ops::latency_plot::plot(&merged, p)?;
        writeln!(out, "plot written to {}", p.display())?;
    }
    Ok(())
}
