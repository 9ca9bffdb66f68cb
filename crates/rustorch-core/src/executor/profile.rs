//! Time per op summed over a run (`RUSTORCH_PROFILE`): where a forward pass
//! spends its time, for one clock read and one map update per op. The trace
//! (`RUSTORCH_TRACE`) prints every op as it runs, which slows the very run it
//! describes; a profile prints nothing until asked.

use crate::shape::Shape;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// What a profile groups ops by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProfileMode {
    /// No profile.
    #[default]
    Off,
    /// One line per op name (`RUSTORCH_PROFILE=1`).
    Ops,
    /// One line per op name and input shapes (`RUSTORCH_PROFILE=shapes`).
    Shapes,
}

impl ProfileMode {
    /// `RUSTORCH_PROFILE`'s values: unset, empty, 0, off, false or no for
    /// `Off`; 1, on, true, yes or ops for `Ops`; shapes for `Shapes`.
    pub fn parse(value: &str) -> Option<ProfileMode> {
        match value.trim() {
            "" | "0" | "off" | "false" | "no" => Some(ProfileMode::Off),
            "1" | "on" | "true" | "yes" | "ops" => Some(ProfileMode::Ops),
            "shapes" => Some(ProfileMode::Shapes),
            _ => None,
        }
    }
}

/// One line of a profile: an op (with its input shapes in `Shapes` mode),
/// how often it ran, its summed execution time (transfers excluded) and
/// the host's summed time issuing it (moving its inputs, the backend's own
/// work: for the CPU, the op itself; for an asynchronous device, its
/// launches, before the device's work ends).
#[derive(Clone, Debug, PartialEq)]
pub struct OpProfile {
    pub op: String,
    pub calls: u64,
    pub total: Duration,
    pub host: Duration,
}

/// The executor's running sums.
#[derive(Debug, Default)]
pub(super) struct Profiler {
    sums: Mutex<HashMap<String, (u64, Duration, Duration)>>,
}

impl Profiler {
    pub(super) fn add<'a>(
        &self,
        mode: ProfileMode,
        op: String,
        shapes: impl IntoIterator<Item = &'a Shape>,
        elapsed: Duration,
        host: Duration,
    ) {
        let key = match mode {
            ProfileMode::Off => return,
            ProfileMode::Ops => op,
            ProfileMode::Shapes => {
                let mut key = op;
                for s in shapes {
                    let _ = write!(key, " {s}");
                }
                key
            }
        };
        if let Ok(mut sums) = self.sums.lock() {
            let e = sums.entry(key).or_default();
            e.0 += 1;
            e.1 += elapsed;
            e.2 += host;
        }
    }

    /// Every line, the most time first.
    pub(super) fn lines(&self) -> Vec<OpProfile> {
        let mut out: Vec<OpProfile> = self
            .sums
            .lock()
            .map(|s| {
                s.iter()
                    .map(|(op, &(calls, total, host))| OpProfile {
                        op: op.clone(),
                        calls,
                        total,
                        host,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.op.cmp(&b.op)));
        out
    }

    pub(super) fn clear(&self) {
        if let Ok(mut s) = self.sums.lock() {
            s.clear();
        }
    }
}

/// A profile as a table: per line its time, share of all ops' time, calls,
/// mean time per call and the host's mean time issuing a call; then the
/// total, and, given the wall time of the
/// run it covers, the share of that time spent outside any op (the caller's
/// own work, and the gaps between ops).
pub fn format_profile(lines: &[OpProfile], wall: Option<Duration>) -> String {
    let total: Duration = lines.iter().map(|l| l.total).sum();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>11} {:>6} {:>8} {:>10} {:>10}  op",
        "time ms", "share", "calls", "mean us", "host us"
    );
    for l in lines {
        let share = if total.is_zero() {
            0.0
        } else {
            100.0 * l.total.as_secs_f64() / total.as_secs_f64()
        };
        let per_call_us = |d: Duration| d.as_secs_f64() * 1e6 / l.calls.max(1) as f64;
        let _ = writeln!(
            out,
            "{:>11.2} {:>5.1}% {:>8} {:>10.2} {:>10.2}  {}",
            ms(l.total),
            share,
            l.calls,
            per_call_us(l.total),
            per_call_us(l.host),
            l.op
        );
    }
    let calls: u64 = lines.iter().map(|l| l.calls).sum();
    let host: Duration = lines.iter().map(|l| l.host).sum();
    let _ = write!(
        out,
        "{:>11.2} {:>6} {:>8} {:>10} {:>10.2}  all ops",
        ms(total),
        "",
        calls,
        "",
        host.as_secs_f64() * 1e6 / calls.max(1) as f64
    );
    if let Some(wall) = wall.filter(|w| !w.is_zero()) {
        let outside = wall.saturating_sub(total);
        let _ = write!(
            out,
            "\n{:>11.2} {:>5.1}% {:>8} {:>10} {:>10}  outside ops, of {:.2} ms wall time",
            ms(outside),
            100.0 * outside.as_secs_f64() / wall.as_secs_f64(),
            "",
            "",
            "",
            ms(wall)
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_op_or_per_shape() {
        let p = Profiler::default();
        let (a, b) = (Shape::from([2, 3]), Shape::from([4]));
        let us = Duration::from_micros;
        p.add(ProfileMode::Ops, "add".into(), [&a], us(3), us(1));
        p.add(ProfileMode::Ops, "add".into(), [&b], us(5), us(2));
        p.add(ProfileMode::Ops, "mul".into(), [&a], us(1), us(1));
        p.add(ProfileMode::Off, "mul".into(), [&a], us(100), us(100));
        let lines = p.lines();
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].op.as_str(), lines[0].calls), ("add", 2));
        assert_eq!((lines[0].total, lines[0].host), (us(8), us(3)));
        assert_eq!((lines[1].op.as_str(), lines[1].calls), ("mul", 1));
        p.clear();
        p.add(ProfileMode::Shapes, "add".into(), [&a, &b], us(2), us(1));
        assert_eq!(p.lines()[0].op, "add [2, 3] [4]");
    }

    #[test]
    fn table_shows_shares_host_time_and_time_outside_ops() {
        let lines = [
            OpProfile {
                op: "qmatmul".into(),
                calls: 3,
                total: Duration::from_millis(3),
                host: Duration::from_micros(60),
            },
            OpProfile {
                op: "add".into(),
                calls: 4,
                total: Duration::from_millis(1),
                host: Duration::from_micros(40),
            },
        ];
        let t = format_profile(&lines, Some(Duration::from_millis(5)));
        assert!(t.contains(" 75.0%        3    1000.00      20.00  qmatmul"), "{t}");
        assert!(t.contains(" 25.0%        4     250.00      10.00  add"), "{t}");
        let all = t.lines().find(|l| l.ends_with("all ops")).expect("a total line");
        // 100 us of host time over 7 calls.
        assert_eq!(
            all.split_whitespace().collect::<Vec<_>>(),
            ["4.00", "7", "14.29", "all", "ops"],
            "{t}"
        );
        assert!(t.contains("1.00  20.0%"), "{t}");
        assert!(t.contains("outside ops, of 5.00 ms wall time"), "{t}");
    }

    #[test]
    fn parses_modes() {
        assert_eq!(ProfileMode::parse("1"), Some(ProfileMode::Ops));
        assert_eq!(ProfileMode::parse(" shapes "), Some(ProfileMode::Shapes));
        assert_eq!(ProfileMode::parse("0"), Some(ProfileMode::Off));
        assert_eq!(ProfileMode::parse("sometimes"), None);
    }
}
