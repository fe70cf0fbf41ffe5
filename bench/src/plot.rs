//! The plots as SVG (plotters' SVG backend only): lines over time, one per series, in the
//! colours the captions list. Used by `make bench` (nodes still waiting per run, the captions
//! in docs/benchmarks.md) and `make demo` (nodes served against the rate-limit bound).

use plotters::prelude::*;

/// One line: its legend, colour and (x, y) points in data units.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: [u8; 3],
    pub points: &'a [(f64, f64)],
}

/// A line plot of `series` on white, axes from 0 to the largest x and y, as an SVG document.
pub fn svg(
    size: (u32, u32),
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> anyhow::Result<String> {
    let max = |f: fn(&(f64, f64)) -> f64| {
        series
            .iter()
            .flat_map(|s| s.points.iter().map(f))
            .fold(0.0, f64::max)
            .max(1e-9)
    };
    let (max_x, max_y) = (max(|p| p.0), max(|p| p.1));
    let mut out = String::new();
    {
        let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("plot: {e}");
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(20)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)
            .map_err(err)?;
        // Grid lines every tenth, as the caption says.
        chart
            .configure_mesh()
            .x_labels(11)
            .y_labels(11)
            .max_light_lines(0)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for s in series {
            let [r, g, b] = s.color;
            let style = RGBColor(r, g, b).stroke_width(2);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(err)?
                .label(s.name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_is_a_line_in_its_colour_with_its_legend() {
        let falling = [(0.0, 10.0), (5.0, 4.0), (10.0, 0.0)];
        let flat = [(0.0, 2.0), (10.0, 2.0)];
        let svg = svg(
            (200, 100),
            "seconds",
            "waiting",
            &[
                Series {
                    name: "falling",
                    color: [255, 0, 0],
                    points: &falling,
                },
                Series {
                    name: "flat",
                    color: [0, 0, 255],
                    points: &flat,
                },
            ],
        )
        .unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        let lines = |colour: &str| {
            svg.lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(colour))
                .map(|l| {
                    let points = l.split("points=\"").nth(1).unwrap();
                    points.split('"').next().unwrap().split_whitespace().count()
                })
                .collect::<Vec<_>>()
        };
        // The data line (one vertex per point) and the legend's sample (two).
        assert_eq!(lines("#FF0000"), vec![3, 2], "{svg}");
        assert_eq!(lines("#0000FF"), vec![2, 2], "{svg}");
        for text in ["falling", "flat", "seconds", "waiting"] {
            assert!(svg.contains(&format!("\n{text}\n")), "{text} in {svg}");
        }
    }
}
