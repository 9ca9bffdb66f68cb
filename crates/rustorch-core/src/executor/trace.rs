//! The record of where each op ran and why.

use crate::device::Device;
use crate::shape::Shape;
use std::fmt::Write;
use std::time::Duration;

/// One routing decision: an op (or a transfer) and where it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// Position in the executor's sequence of events.
    pub seq: u64,
    pub op: String,
    /// Shapes of the inputs, for reading the trace.
    pub input_shapes: Vec<Shape>,
    pub dtype: String,
    /// Where it finally ran.
    pub device: Device,
    /// Why that device was chosen.
    pub reason: String,
    /// Devices that were tried first and failed, with the error each gave.
    pub fallbacks: Vec<(Device, String)>,
    /// Bytes copied between devices to run it.
    pub bytes_moved: usize,
    /// Wall time of the execution on the chosen device (transfers excluded).
    pub elapsed: Duration,
}

/// Formats events as an aligned table.
pub fn format_table(events: &[TraceEvent]) -> String {
    let header = [
        "#", "op", "inputs", "dtype", "device", "reason", "fallback", "moved", "time",
    ];
    let rows: Vec<[String; 9]> = events
        .iter()
        .map(|e| {
            [
                e.seq.to_string(),
                e.op.clone(),
                e.input_shapes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                e.dtype.clone(),
                e.device.to_string(),
                e.reason.clone(),
                if e.fallbacks.is_empty() {
                    "-".into()
                } else {
                    e.fallbacks
                        .iter()
                        .map(|(d, why)| format!("{d}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                },
                format_bytes(e.bytes_moved),
                format!("{:.1?}", e.elapsed),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", parts.join(" | ").trim_end());
    };
    line(&mut out, &header.map(String::from));
    line(&mut out, &widths.map(|w| "-".repeat(w)));
    for r in &rows {
        line(&mut out, r);
    }
    out
}

fn format_bytes(b: usize) -> String {
    match b {
        0 => "0".into(),
        b if b < 1 << 10 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
    }
}
