//! The report's pictures, as SVG strings (plotters' SVG backend; text is left to the viewer's
//! fonts, so no font files are needed): the cold-start anatomy as stacked bars, a latency
//! CDF, and a timeline of a run.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::Error;
use crate::anatomy::{Anatomy, SEGMENTS};

const SIZE: (u32, u32) = (900, 520);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

fn render(
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), Error>,
) -> Result<String, Error> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Which percentile of a [`crate::stats::Percentiles`] a bar shows.
type Pick = fn(&crate::stats::Percentiles) -> f64;

/// Stacked bars of the cold-start segments at p50, p90 and p99 (each segment's own
/// percentile, so a bar's height is not the total's percentile: the total is drawn as a dot).
pub fn anatomy(title: &str, a: &Anatomy) -> Result<String, Error> {
    let bars: [(&str, Pick); 3] = [("p50", |p| p.p50), ("p90", |p| p.p90), ("p99", |p| p.p99)];
    let top = bars
        .iter()
        .map(|(_, f)| {
            let stacked: f64 = a.segments().iter().map(|p| f(p)).sum();
            stacked.max(f(&a.total_ms))
        })
        .fold(1.0, f64::max)
        * 1.15;
    render(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..2.5, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(7)
            .x_label_formatter(&|x: &f64| {
                // Ticks fall between bars too; only the bars' own get a name.
                let i = x.round();
                if (x - i).abs() > 1e-6 || i < 0.0 {
                    return String::new();
                }
                bars.get(i as usize)
                    .map(|b| b.0.to_string())
                    .unwrap_or_default()
            })
            .y_desc("ms since the first request arrived")
            .draw()
            .map_err(err)?;
        for (s, name) in SEGMENTS.iter().enumerate() {
            let color = COLORS[s];
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .enumerate()
                .map(|(i, (_, f))| {
                    let below: f64 = a.segments()[..s].iter().map(|p| f(p)).sum();
                    let h = f(a.segments()[s]);
                    let x = i as f64;
                    Rectangle::new([(x - 0.25, below), (x + 0.25, below + h)], color.filled())
                })
                .collect();
            chart
                .draw_series(rects)
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .map(|(i, (_, f))| Circle::new((i as f64, f(&a.total_ms)), 5, BLACK.filled())),
            )
            .map_err(err)?
            .label("arrival→first byte (whole)")
            .legend(|(x, y)| Circle::new((x + 6, y), 5, BLACK.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)
    })
}

/// The cumulative distribution of each series' latencies (ms, log scale). A non-finite value
/// is a request that got no answer (failed, or did not complete): it counts in the series'
/// n, so the curve ends below 1 by the share that failed, and the legend says how many.
pub fn cdf(title: &str, series: &[(&str, Vec<f64>)]) -> Result<String, Error> {
    let all = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite());
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi <= 0.0 {
        (0.01, 1.0)
    } else {
        ((lo.max(0.001)) * 0.8, hi * 1.25)
    };
    render(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_labels(12)
            .x_desc("latency, ms (log scale)")
            .y_desc("fraction of requests")
            .draw()
            .map_err(err)?;
        for (i, (name, values)) in series.iter().enumerate() {
            if values.is_empty() {
                continue;
            }
            // A request that got no answer counts in n and is never drawn: the curve stops
            // at the share answered.
            let mut v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            let n = values.len() as f64;
            let failed = values.len() - v.len();
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    v.iter()
                        .enumerate()
                        .map(|(k, x)| (x.max(lo), (k + 1) as f64 / n)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(if failed == 0 {
                    format!("{name} (n={})", values.len())
                } else {
                    format!("{name} (n={}, {failed} not answered)", values.len())
                })
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)
    })
}

/// A line of a timeline: (seconds since the start, value).
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Lines over time, with vertical marks at moments that matter (a node killed, subsets
/// repaired).
pub fn timeline(
    title: &str,
    y_desc: &str,
    lines: &[Line],
    marks: &[(f64, String)],
) -> Result<String, Error> {
    let x_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.0))
        .fold(1.0, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.15;
    render(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the load started")
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for (i, line) in lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(line.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
        }
        for (x, what) in marks {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(*x, 0.0), (*x, y_max)],
                    BLACK.stroke_width(1),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    what.clone(),
                    (*x, y_max * 0.97),
                    ("sans-serif", 13),
                )))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)
    })
}

/// Counts per time bucket: `(seconds, ok)` events into `bucket`-wide bins, as
/// (bucket start, ok count, error count).
pub fn bucket(events: impl IntoIterator<Item = (f64, bool)>, bucket: f64) -> Vec<(f64, f64, f64)> {
    let mut bins: Vec<(f64, f64)> = Vec::new();
    for (t, ok) in events {
        let i = (t.max(0.0) / bucket) as usize;
        if bins.len() <= i {
            bins.resize(i + 1, (0.0, 0.0));
        }
        if ok {
            bins[i].0 += 1.0;
        } else {
            bins[i].1 += 1.0;
        }
    }
    bins.into_iter()
        .enumerate()
        .map(|(i, (ok, bad))| (i as f64 * bucket, ok, bad))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anatomy::ColdPhases;

    #[test]
    fn pictures_are_svg_with_their_labels() {
        let phases: Vec<ColdPhases> = (0..20)
            .map(|i| ColdPhases {
                pod_post: 1.0,
                pod_bound: 7.0 + i as f64,
                pod_ready: 320.0 + i as f64,
                wait: 322.0 + i as f64,
                ..ColdPhases::default()
            })
            .collect();
        let svg = anatomy("cold start", &Anatomy::of(&phases)).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        for s in SEGMENTS {
            assert!(svg.contains(s), "legend names {s}");
        }
        let svg = cdf(
            "latency",
            &[
                ("cold", vec![300.0, 310.0, f64::INFINITY]),
                ("warm", vec![0.5, 1.0, 2.0]),
            ],
        )
        .unwrap();
        assert!(svg.contains("warm (n=3)"), "{svg}");
        assert!(svg.contains("cold (n=3, 1 not answered)"), "{svg}");
        let svg = timeline(
            "run",
            "requests per 100 ms",
            &[Line {
                name: "ok".into(),
                points: vec![(0.0, 3.0), (1.0, 5.0)],
            }],
            &[(0.5, "node killed".into())],
        )
        .unwrap();
        assert!(svg.contains("node killed"));
        // Nothing to plot still gives a picture, not an error.
        assert!(
            cdf("empty", &[("none", vec![])])
                .unwrap()
                .starts_with("<svg")
        );
    }

    #[test]
    fn bucketing_counts_ok_and_errors_per_bin() {
        let b = bucket([(0.05, true), (0.07, false), (0.25, true)], 0.1);
        assert_eq!(b, vec![(0.0, 1.0, 1.0), (0.1, 0.0, 0.0), (0.2, 1.0, 0.0)]);
    }
}
