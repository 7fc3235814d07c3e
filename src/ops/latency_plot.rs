//! `kmirror latency FILE --plot OUT.svg|OUT.png`: the percentile distribution of each latency
//! (the classic HdrHistogram plot: x = percentile on a "nines" scale, y = latency in ms),
//! drawn with plotters. Text needs a TrueType font: DejaVu Sans from the system
//! (Debian package fonts-dejavu-core) or the file named by `KMIRROR_PLOT_FONT`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::ops::latency::{LatencyError, Merged};

/// The plot's x axis ends at 99.9999% (six nines).
const MAX_NINES: f64 = 6.0;
const SIZE: (u32, u32) = (1000, 600);

const FONT_CANDIDATES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn plot_err(path: &Path, why: impl std::fmt::Display) -> LatencyError {
    LatencyError::Plot {
        path: path.to_owned(),
        why: why.to_string(),
    }
}

/// Registers the font once per process; the result (or why not) is remembered.
fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("KMIRROR_PLOT_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from))
            .collect();
        let path = candidates.iter().find(|p| p.exists()).ok_or_else(|| {
            format!(
                "no TrueType font found (tried {candidates:?}): install fonts-dejavu-core or \
                 set KMIRROR_PLOT_FONT"
            )
        })?;
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // plotters keeps fonts for the process lifetime; the font is loaded once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    })
    .clone()
}

/// (nines, ms) points of each latency with samples.
fn series(merged: &Merged) -> Vec<(String, Vec<(f64, f64)>)> {
    merged
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(name, h)| {
            let pts = h
                .iter_quantiles(2)
                .map(|v| {
                    let q = v.quantile_iterated_to();
                    let nines = if q >= 1.0 {
                        MAX_NINES
                    } else {
                        (-(1.0 - q).log10()).min(MAX_NINES)
                    };
                    (nines, v.value_iterated_to() as f64 / 1e6)
                })
                .collect();
            (name.clone(), pts)
        })
        .collect()
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.001, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("kmirror latency by percentile", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..MAX_NINES, 0f64..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_labels(MAX_NINES as usize + 1)
        .x_label_formatter(&|x| format!("{}%", 100.0 * (1.0 - 10f64.powf(-x))))
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draws `merged` to `path`; the extension (`.svg` or `.png`) picks the format.
pub fn plot(merged: &Merged, path: &Path) -> Result<(), LatencyError> {
    let series = series(merged);
    if series.is_empty() {
        return Err(plot_err(path, "no samples to plot"));
    }
    ensure_font().map_err(|why| plot_err(path, why))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => draw(SVGBackend::new(path, SIZE).into_drawing_area(), &series),
        Some("png") => draw(BitMapBackend::new(path, SIZE).into_drawing_area(), &series),
        _ => return Err(plot_err(path, "the file name must end in .svg or .png")),
    }
    .map_err(|why| plot_err(path, why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;

    fn merged() -> Merged {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1_000).unwrap();
        }
        let mut m = Merged::new();
        m.insert("append".into(), h);
        m
    }

    #[test]
    fn draws_svg_and_png_and_refuses_other_names() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("p.svg");
        plot(&merged(), &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
        assert!(text.contains("append") && text.contains("latency (ms)"));
        assert!(text.contains("<polyline"), "no line drawn");
        let png = dir.path().join("p.png");
        plot(&merged(), &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(matches!(
            plot(&merged(), &dir.path().join("p.jpg")),
            Err(LatencyError::Plot { .. })
        ));
    }
}
