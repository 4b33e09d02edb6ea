//! Drawing a pipeline's timeline: loader rows with the batches they produce, the ready queue's
//! occupancy as a step plot and the consumer row (steps and stalls), as an SVG and as a
//! self-contained animated HTML page (inline SVG and script, no network: a play/pause button,
//! a time slider and a live view of the queue's slots).
//!
//! The input is plain data — spans per loader row, queue steps, consumer spans — so the same
//! drawing serves the simulator and measured traces. Several [`Timeline`]s (e.g. one per
//! policy) are drawn as panels of one figure on a shared time axis.

use std::fmt::Write;

/// One loader's work: a batch from `start` to `end` (seconds from the start of the figure).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub start: f64,
    pub end: f64,
    pub batch: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoaderRow {
    pub label: String,
    pub spans: Vec<Span>,
}

/// The number of batches ready and waiting: `steps[i].1` holds from `steps[i].0` until the next
/// step's time (seconds, increasing).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueSeries {
    pub label: String,
    /// The most it can hold (drawn as a dashed line and as the page's slots), if known.
    pub capacity: Option<u32>,
    pub steps: Vec<(f64, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConsumerState {
    /// Computing on `batch`, produced by loader row `loader` (which colours it), if known.
    Busy { batch: u64, loader: Option<usize> },
    /// Waiting for a batch.
    Stall,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsumerSpan {
    pub start: f64,
    pub end: f64,
    pub state: ConsumerState,
}

/// One panel: a title, lines of notes under it, and the rows, over `[0, end]` seconds. Spans
/// reaching past `end` are cut there.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    pub title: String,
    pub notes: Vec<String>,
    pub end: f64,
    pub loaders: Vec<LoaderRow>,
    pub queue: QueueSeries,
    pub consumer: Vec<ConsumerSpan>,
}

/// Loader colours (fill, text), cycled.
const PALETTE: [(&str, &str); 8] = [
    ("#4e79a7", "#fff"),
    ("#f28e2b", "#222"),
    ("#59a14f", "#fff"),
    ("#b07aa1", "#fff"),
    ("#76b7b2", "#222"),
    ("#edc948", "#222"),
    ("#9c755f", "#fff"),
    ("#bab0ac", "#222"),
];
const STALL: &str = "#e15759";
const QUEUE_FILL: &str = "#a8c5e2";
const QUEUE_LINE: &str = "#2f5d8a";

const WIDTH: f64 = 1200.0;
/// The label column on the left.
const LEFT: f64 = 120.0;
const RIGHT: f64 = 24.0;
const PLOT: f64 = WIDTH - LEFT - RIGHT;
const ROW: f64 = 18.0;
const ROW_GAP: f64 = 4.0;
const QUEUE_H: f64 = 56.0;
const CONSUMER_H: f64 = 24.0;
/// At most this many loader rows are drawn per panel.
pub const MAX_ROWS: usize = 64;

fn colour(row: usize) -> (&'static str, &'static str) {
    PALETTE[row % PALETTE.len()]
}

/// Text for XML: `&`, `<`, `>` and `"` escaped.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The shared time axis: `end` seconds over the plot width, labelled in ms or s.
struct Axis {
    end: f64,
    /// Unit name and seconds → unit factor.
    unit: (&'static str, f64),
    /// Tick spacing in the unit.
    step: f64,
}

impl Axis {
    fn new(end: f64) -> Self {
        let end = if end > 0.0 && end.is_finite() {
            end
        } else {
            1.0
        };
        let unit = if end < 2.0 { ("ms", 1e3) } else { ("s", 1.0) };
        let raw = end * unit.1 / 10.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|&s| s >= raw * 0.999)
            .unwrap_or(10.0 * mag);
        Axis { end, unit, step }
    }

    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.end).clamp(0.0, 1.0) * PLOT
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        let decimals = if self.step >= 1.0 {
            0
        } else {
            (-self.step.log10()).ceil() as usize
        };
        let last = (self.end * self.unit.1 / self.step + 1e-9).floor() as u64;
        (0..=last)
            .map(|i| {
                let v = i as f64 * self.step;
                (v / self.unit.1, format!("{v:.decimals$}"))
            })
            .collect()
    }
}

/// Writes one panel from `top`; returns its height. Axes and labels go to `frame`, the data
/// (what the animation reveals) to `data`.
fn panel(tl: &Timeline, axis: &Axis, top: f64, frame: &mut String, data: &mut String) -> f64 {
    let mut y = top + 18.0;
    let _ = writeln!(
        frame,
        r#"<text x="12" y="{y:.1}" class="title">{}</text>"#,
        esc(&tl.title)
    );
    for note in &tl.notes {
        y += 16.0;
        let _ = writeln!(
            frame,
            r#"<text x="12" y="{y:.1}" class="note">{}</text>"#,
            esc(note)
        );
    }
    let rows_top = y + 14.0;
    let rows = tl.loaders.len().min(MAX_ROWS);
    let queue_top = rows_top + rows as f64 * (ROW + ROW_GAP) + 8.0;
    let consumer_top = queue_top + QUEUE_H + 10.0;
    let axis_y = consumer_top + CONSUMER_H + 6.0;
    // Grid lines at the ticks, under everything.
    for (t, _) in axis.ticks() {
        let x = axis.x(t);
        let _ = writeln!(
            frame,
            r#"<line x1="{x:.1}" y1="{rows_top:.1}" x2="{x:.1}" y2="{axis_y:.1}" class="grid"/>"#
        );
    }
    let band = |frame: &mut String, y: f64, h: f64| {
        let _ = writeln!(
            frame,
            r#"<rect x="{LEFT}" y="{y:.1}" width="{PLOT}" height="{h:.1}" class="band"/>"#
        );
    };
    let label = |frame: &mut String, y: f64, text: &str| {
        let _ = writeln!(
            frame,
            r#"<text x="{:.1}" y="{:.1}" class="label">{}</text>"#,
            LEFT - 8.0,
            y + 4.0,
            esc(text)
        );
    };
    // Loader rows.
    for (k, row) in tl.loaders.iter().take(rows).enumerate() {
        let ry = rows_top + k as f64 * (ROW + ROW_GAP);
        band(frame, ry, ROW);
        label(frame, ry + ROW / 2.0, &row.label);
        let (fill, ink) = colour(k);
        for s in &row.spans {
            bar(
                data,
                axis,
                s.start,
                s.end,
                ry,
                ROW,
                fill,
                Some((s.batch, ink)),
            );
        }
    }
    if tl.loaders.len() > rows {
        let _ = writeln!(
            frame,
            r#"<text x="{:.1}" y="{:.1}" class="note">… {} more loader rows not drawn</text>"#,
            LEFT,
            queue_top - 2.0,
            tl.loaders.len() - rows
        );
    }
    // The queue as a step plot.
    band(frame, queue_top, QUEUE_H);
    label(frame, queue_top + QUEUE_H / 2.0 - 6.0, &tl.queue.label);
    let seen = tl.queue.steps.iter().map(|s| s.1).max().unwrap_or(0);
    let top_value = tl.queue.capacity.unwrap_or(0).max(seen).max(1);
    let qy = |v: u32| queue_top + QUEUE_H - 2.0 - (QUEUE_H - 6.0) * v as f64 / top_value as f64;
    let _ = writeln!(
        frame,
        r#"<text x="{:.1}" y="{:.1}" class="small">0</text><text x="{:.1}" y="{:.1}" class="small">{top_value}</text>"#,
        LEFT - 4.0,
        qy(0) + 3.0,
        LEFT - 4.0,
        qy(top_value) + 3.0
    );
    let _ = writeln!(
        frame,
        r#"<text x="{:.1}" y="{:.1}" class="label small-label">batches waiting</text>"#,
        LEFT - 8.0,
        queue_top + QUEUE_H / 2.0 + 10.0
    );
    if let Some(cap) = tl.queue.capacity {
        let y = qy(cap);
        let _ = writeln!(
            frame,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" class="cap"/><text x="{:.1}" y="{:.1}" class="small cap-label">limit {cap}</text>"#,
            LEFT + PLOT,
            LEFT + PLOT - 2.0,
            y - 3.0
        );
    }
    if !tl.queue.steps.is_empty() {
        let mut path = format!("M{:.1},{:.1}", axis.x(0.0), qy(0));
        for &(t, v) in &tl.queue.steps {
            if t > axis.end {
                break;
            }
            let _ = write!(path, " H{:.1} V{:.1}", axis.x(t), qy(v));
        }
        let _ = write!(path, " H{:.1} V{:.1} Z", axis.x(tl.end), qy(0));
        let _ = writeln!(
            data,
            r#"<path d="{path}" fill="{QUEUE_FILL}" stroke="{QUEUE_LINE}" stroke-width="1.2"/>"#
        );
    }
    // The consumer.
    band(frame, consumer_top, CONSUMER_H);
    label(frame, consumer_top + CONSUMER_H / 2.0, "consumer");
    for s in &tl.consumer {
        match s.state {
            ConsumerState::Busy { batch, loader } => {
                let (fill, ink) = loader.map_or(("#8c8c8c", "#fff"), colour);
                bar(
                    data,
                    axis,
                    s.start,
                    s.end,
                    consumer_top,
                    CONSUMER_H,
                    fill,
                    Some((batch, ink)),
                );
            }
            ConsumerState::Stall => bar(
                data,
                axis,
                s.start,
                s.end,
                consumer_top,
                CONSUMER_H,
                "url(#stall)",
                None,
            ),
        }
    }
    // The time axis.
    let _ = writeln!(
        frame,
        r#"<line x1="{LEFT}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" class="axis"/>"#,
        LEFT + PLOT
    );
    for (t, text) in axis.ticks() {
        let x = axis.x(t);
        let _ = writeln!(
            frame,
            r#"<line x1="{x:.1}" y1="{axis_y:.1}" x2="{x:.1}" y2="{:.1}" class="axis"/><text x="{x:.1}" y="{:.1}" class="tick">{text}</text>"#,
            axis_y + 4.0,
            axis_y + 16.0
        );
    }
    let _ = writeln!(
        frame,
        r#"<text x="{:.1}" y="{:.1}" class="label">time ({})</text>"#,
        LEFT - 8.0,
        axis_y + 16.0,
        axis.unit.0
    );
    axis_y + 30.0 - top
}

/// A span as a rectangle (cut to the window), labelled with its batch number where it fits.
#[allow(clippy::too_many_arguments)]
fn bar(
    out: &mut String,
    axis: &Axis,
    start: f64,
    end: f64,
    y: f64,
    h: f64,
    fill: &str,
    label: Option<(u64, &str)>,
) {
    if start >= axis.end || end <= start {
        return;
    }
    let (x0, x1) = (axis.x(start), axis.x(end));
    let w = (x1 - x0).max(0.6);
    let _ = writeln!(
        out,
        r#"<rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="{fill}" class="span"/>"#
    );
    if let Some((batch, ink)) = label {
        let text = batch.to_string();
        if w >= 6.2 * text.len() as f64 + 4.0 {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" fill="{ink}" class="batch">{text}</text>"#,
                x0 + w / 2.0,
                y + h / 2.0 + 3.5
            );
        }
    }
}

fn legend(out: &mut String, top: f64, loaders: usize) -> f64 {
    let mut x = 12.0;
    let y = top + 14.0;
    let item = |out: &mut String, x: &mut f64, fill: &str, text: &str| {
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="11" fill="{fill}" class="span"/><text x="{:.1}" y="{:.1}" class="legend">{}</text>"#,
            *x,
            y - 9.5,
            *x + 18.0,
            y,
            esc(text)
        );
        *x += 18.0 + 6.4 * text.chars().count() as f64 + 16.0;
    };
    for k in 0..loaders.min(PALETTE.len()) {
        item(out, &mut x, colour(k).0, &format!("loader {k}"));
    }
    if loaders > PALETTE.len() {
        item(out, &mut x, "#fff", "(colours repeat)");
    }
    let y2 = top + 32.0;
    let _ = writeln!(
        out,
        r#"<text x="12" y="{y2:.1}" class="legend">Bars are batches (numbered) in the colour of the loader that made them; the consumer computes on them in that colour.</text>"#
    );
    let mut x = 12.0;
    let y = top + 52.0;
    let item2 = |out: &mut String, x: &mut f64, fill: &str, text: &str| {
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="11" fill="{fill}" class="span"/><text x="{:.1}" y="{:.1}" class="legend">{}</text>"#,
            *x,
            y - 9.5,
            *x + 18.0,
            y,
            esc(text)
        );
        *x += 18.0 + 6.4 * text.chars().count() as f64 + 16.0;
    };
    item2(
        out,
        &mut x,
        "url(#stall)",
        "consumer stall (waiting for a batch)",
    );
    item2(
        out,
        &mut x,
        QUEUE_FILL,
        "ready queue: finished batches not yet taken",
    );
    top + 64.0
}

const STYLE: &str = r#"<style>
text { font-family: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; fill: #222; }
.title { font-size: 15px; font-weight: bold; }
.note { font-size: 11.5px; fill: #555; }
.label { font-size: 12px; text-anchor: end; }
.small-label { font-size: 10px; fill: #666; }
.small { font-size: 10px; text-anchor: end; fill: #666; }
.cap-label { fill: #888; }
.tick { font-size: 10.5px; text-anchor: middle; fill: #444; }
.legend { font-size: 11.5px; }
.batch { font-size: 10px; text-anchor: middle; font-weight: bold; }
.band { fill: #f5f5f5; }
.grid { stroke: #e2e2e2; stroke-width: 1; }
.axis { stroke: #444; stroke-width: 1; }
.cap { stroke: #999; stroke-width: 1; stroke-dasharray: 4 3; }
.span { stroke: #fff; stroke-width: 0.6; }
</style>"#;

/// The figure: `panels` one under the other on a shared time axis (the longest `end`), a
/// legend at the bottom. `animated` adds the hooks the HTML page drives: a clip that reveals the
/// data up to the current time and a cursor line.
fn render(panels: &[Timeline], animated: bool) -> String {
    let end = panels.iter().map(|p| p.end).fold(0.0, f64::max);
    let axis = Axis::new(end);
    let mut frame = String::new();
    let mut data = String::new();
    let mut y = 4.0;
    for (i, p) in panels.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(
                frame,
                r##"<line x1="12" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ccc"/>"##,
                y + 4.0,
                WIDTH - 12.0,
                y + 4.0
            );
            y += 10.0;
        }
        y += panel(p, &axis, y, &mut frame, &mut data);
    }
    let loaders = panels.iter().map(|p| p.loaders.len()).max().unwrap_or(0);
    let height = legend(&mut frame, y, loaders) + 6.0;
    let mut svg = String::with_capacity(frame.len() + data.len() + 2048);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" id="timeline">"#
    );
    svg.push_str(STYLE);
    svg.push('\n');
    let _ = writeln!(
        svg,
        r##"<defs><pattern id="stall" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fbdcdd"/><rect width="2.5" height="6" fill="{STALL}"/></pattern>{}</defs>"##,
        if animated {
            format!(
                r#"<clipPath id="reveal"><rect id="reveal-rect" x="0" y="0" width="{WIDTH}" height="{height:.0}"/></clipPath>"#
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{WIDTH}" height="{height:.0}" fill="#fff"/>"##
    );
    svg.push_str(&frame);
    if animated {
        svg.push_str("<g clip-path=\"url(#reveal)\">\n");
    } else {
        svg.push_str("<g>\n");
    }
    svg.push_str(&data);
    svg.push_str("</g>\n");
    if animated {
        let _ = writeln!(
            svg,
            r##"<line id="cursor" x1="{LEFT}" y1="0" x2="{LEFT}" y2="{height:.0}" stroke="#d62728" stroke-width="1.5"/>"##
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The figure as a standalone SVG document.
pub fn svg(panels: &[Timeline]) -> String {
    render(panels, false)
}

/// A self-contained HTML page that plays the figure: the timeline is revealed up to a moving
/// cursor, and per panel the queue's slots fill and drain, with batches consumed and stall so
/// far. Play/pause, a time slider and a speed choice; no network access.
pub fn html(panels: &[Timeline], title: &str) -> String {
    let end = panels.iter().map(|p| p.end).fold(0.0, f64::max);
    let axis = Axis::new(end);
    let data = serde_json::json!({
        "end": axis.end,
        "x0": LEFT,
        "plot": PLOT,
        "unit": axis.unit.0,
        "scale": axis.unit.1,
        "panels": panels.iter().map(|p| {
            let busy: Vec<[f64; 2]> = p.consumer.iter()
                .filter(|s| matches!(s.state, ConsumerState::Busy { .. }))
                .map(|s| [s.start, s.end]).collect();
            let stalls: Vec<[f64; 2]> = p.consumer.iter()
                .filter(|s| s.state == ConsumerState::Stall)
                .map(|s| [s.start, s.end]).collect();
            serde_json::json!({
                "name": p.title.split(" — ").next().unwrap_or(&p.title),
                "capacity": p.queue.capacity,
                "queue": p.queue.steps,
                "busy": busy,
                "stalls": stalls,
            })
        }).collect::<Vec<_>>(),
    });
    // `</` inside a script would end it early.
    let data = data.to_string().replace("</", "<\\/");
    let mut page = String::new();
    let _ = write!(
        page,
        r##"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 10px; }}
.controls {{ display: flex; align-items: center; gap: 12px; margin-bottom: 8px; }}
.controls button {{ font-size: 14px; padding: 4px 14px; min-width: 90px; }}
.controls input[type=range] {{ width: 520px; }}
#clock {{ font-variant-numeric: tabular-nums; min-width: 110px; }}
.status {{ display: flex; flex-direction: column; gap: 4px; margin-bottom: 8px; font-size: 13px; }}
.row {{ display: flex; align-items: center; gap: 10px; }}
.row .name {{ width: 70px; font-weight: bold; }}
.slots {{ display: flex; gap: 2px; }}
.slot {{ width: 14px; height: 14px; border: 1px solid #2f5d8a; background: #fff; }}
.slot.full {{ background: #2f5d8a; }}
.nums {{ font-variant-numeric: tabular-nums; color: #333; }}
</style>
</head>
<body>
<h1>{title}</h1>
<div class="controls">
<button id="play" type="button">Pause</button>
<input id="slider" type="range" min="0" max="1000" value="0" aria-label="time">
<span id="clock"></span>
<label>speed <select id="speed"><option value="0.25">0.25×</option><option value="0.5">0.5×</option><option value="1" selected>1×</option><option value="2">2×</option><option value="4">4×</option></select></label>
</div>
<div class="status" id="status"></div>
{svg}
<script>
const DATA = {data};
const PLAY_SECONDS = 12; // the whole window at 1×
const svg = document.getElementById("timeline");
const reveal = document.getElementById("reveal-rect");
const cursor = document.getElementById("cursor");
const slider = document.getElementById("slider");
const button = document.getElementById("play");
const clock = document.getElementById("clock");
const speed = document.getElementById("speed");
const status = document.getElementById("status");
let t = 0, playing = true, last = null;
const rows = DATA.panels.map(p => {{
  const row = document.createElement("div");
  row.className = "row";
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = p.name;
  const slots = document.createElement("span");
  slots.className = "slots";
  const cap = Math.min(p.capacity || 0, 64);
  const boxes = [];
  for (let i = 0; i < cap; i++) {{
    const b = document.createElement("span");
    b.className = "slot";
    slots.appendChild(b);
    boxes.push(b);
  }}
  const nums = document.createElement("span");
  nums.className = "nums";
  row.append(name, slots, nums);
  status.appendChild(row);
  return {{ p, boxes, nums }};
}});
function occupancy(steps, t) {{
  let lo = 0, hi = steps.length - 1, r = -1;
  while (lo <= hi) {{
    const m = (lo + hi) >> 1;
    if (steps[m][0] <= t) {{ r = m; lo = m + 1; }} else {{ hi = m - 1; }}
  }}
  return r < 0 ? 0 : steps[r][1];
}}
function fmt(t) {{
  const v = t * DATA.scale;
  return v.toFixed(DATA.scale > 1 ? 1 : 3) + " " + DATA.unit;
}}
function render() {{
  const x = DATA.x0 + DATA.plot * Math.min(t / DATA.end, 1);
  reveal.setAttribute("width", x);
  cursor.setAttribute("x1", x);
  cursor.setAttribute("x2", x);
  slider.value = Math.round(1000 * t / DATA.end);
  clock.textContent = fmt(t);
  for (const r of rows) {{
    const q = occupancy(r.p.queue, t);
    r.boxes.forEach((b, i) => b.classList.toggle("full", i < q));
    const done = r.p.busy.filter(s => s[1] <= t).length;
    let stall = 0;
    for (const s of r.p.stalls) if (s[0] < t) stall += Math.min(s[1], t) - s[0];
    const pct = t > 0 ? (100 * stall / t).toFixed(1) : "0.0";
    r.nums.textContent = "queue " + q + (r.p.capacity ? "/" + r.p.capacity : "") +
      " · batches done " + done + " · stall so far " + pct + " %";
  }}
}}
function frame(now) {{
  if (playing) {{
    if (last !== null) {{
      t += (now - last) / 1000 * DATA.end / PLAY_SECONDS * Number(speed.value);
      if (t >= DATA.end) {{ t = DATA.end; playing = false; button.textContent = "Play"; }}
    }}
    last = now;
    render();
  }} else {{
    last = null;
  }}
  requestAnimationFrame(frame);
}}
button.addEventListener("click", () => {{
  if (!playing && t >= DATA.end) t = 0;
  playing = !playing;
  button.textContent = playing ? "Pause" : "Play";
}});
slider.addEventListener("input", () => {{
  t = DATA.end * slider.value / 1000;
  playing = false;
  button.textContent = "Play";
  render();
}});
render();
requestAnimationFrame(frame);
</script>
</body>
</html>
"##,
        title = esc(title),
        svg = render(panels, true),
    );
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Timeline {
        Timeline {
            title: "any — a & b <test>".into(),
            notes: vec!["2 loaders".into()],
            end: 0.010,
            loaders: vec![
                LoaderRow {
                    label: "loader 0".into(),
                    spans: vec![
                        Span {
                            start: 0.0,
                            end: 0.004,
                            batch: 0,
                        },
                        Span {
                            start: 0.004,
                            end: 0.012,
                            batch: 2,
                        },
                    ],
                },
                LoaderRow {
                    label: "loader 1".into(),
                    spans: vec![Span {
                        start: 0.0,
                        end: 0.004,
                        batch: 1,
                    }],
                },
            ],
            queue: QueueSeries {
                label: "ready queue".into(),
                capacity: Some(4),
                steps: vec![(0.0, 0), (0.004, 1), (0.005, 0)],
            },
            consumer: vec![
                ConsumerSpan {
                    start: 0.0,
                    end: 0.004,
                    state: ConsumerState::Stall,
                },
                ConsumerSpan {
                    start: 0.004,
                    end: 0.005,
                    state: ConsumerState::Busy {
                        batch: 0,
                        loader: Some(0),
                    },
                },
            ],
        }
    }

    #[test]
    fn svg_is_well_formed_with_rows_axis_and_legend() {
        let svg = svg(&[sample(), sample()]);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        for want in [
            "loader 0",
            "loader 1",
            "ready queue",
            "consumer",
            "time (ms)",
            "any — a & b <test>",
            "limit 4",
            "consumer stall (waiting for a batch)",
        ] {
            assert!(texts.contains(&want), "{want:?} not in {texts:?}");
        }
        // Ticks every 1 ms from 0 to 10.
        for tick in ["0", "1", "5", "10"] {
            assert!(texts.contains(&tick), "tick {tick}");
        }
        // The span past the window is cut at its end.
        let right = LEFT + PLOT;
        for r in doc.descendants().filter(|n| n.has_tag_name("rect")) {
            if let (Some(x), Some(w)) = (r.attribute("x"), r.attribute("width")) {
                let (x, w): (f64, f64) = (x.parse().unwrap(), w.parse().unwrap());
                assert!(x + w <= WIDTH + 0.01, "rect past the figure");
                if r.attribute("class") == Some("span") && x > LEFT {
                    assert!(x + w <= right + 0.01);
                }
            }
        }
        assert!(svg.contains("url(#stall)"));
        assert!(
            !svg.contains("clip-path"),
            "static SVG has no animation hooks"
        );
    }

    #[test]
    fn html_embeds_svg_script_and_controls() {
        let page = html(&[sample()], "sim </script> & co");
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<svg") && page.contains("clip-path=\"url(#reveal)\""));
        assert!(page.contains("id=\"play\"") && page.contains("id=\"slider\""));
        // Exactly one script, not cut short by the title or the data.
        assert_eq!(page.matches("<script>").count(), 1);
        assert_eq!(page.matches("</script>").count(), 1);
        assert!(!page.contains("http://") || page.matches("http://").count() == 1);
        let svg_start = page.find("<svg").unwrap();
        let svg_end = page.find("</svg>").unwrap() + "</svg>".len();
        roxmltree::Document::parse(&page[svg_start..svg_end]).expect("inline SVG is XML");
        let data = page
            .split("const DATA = ")
            .nth(1)
            .unwrap()
            .split(";\n")
            .next()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["panels"][0]["name"], "any");
        assert_eq!(v["panels"][0]["capacity"], 4);
        assert_eq!(v["panels"][0]["busy"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn axis_ticks_are_round_numbers() {
        let a = Axis::new(0.06);
        assert_eq!(a.unit.0, "ms");
        let labels: Vec<String> = a.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "10", "20", "30", "40", "50", "60"]);
        let a = Axis::new(7.3);
        assert_eq!(a.unit.0, "s");
        let labels: Vec<String> = a.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "1", "2", "3", "4", "5", "6", "7"]);
        let a = Axis::new(0.0012);
        let labels: Vec<String> = a.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels.last().unwrap(), "1.2");
    }
}
