//! `strftime_now(format)` for chat templates (Llama 3.x prints "Today Date: 26 Jul 2024").
//!
//! HF and llama.cpp call the C library's `strftime` on the local time; this formats UTC (what a
//! container's local time usually is) in the C locale, with the conversions templates use. An
//! unknown conversion is an error rather than a guess.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC calendar time.
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize, // 0 = Sunday
    yday: u32,      // 1..=366
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn civil(t: SystemTime) -> Civil {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as usize,
        yday,
    }
}

/// Formats `t` (as UTC) with a C `strftime` format; `Err` names an unsupported conversion.
pub fn strftime(format: &str, t: SystemTime) -> Result<String, String> {
    let c = civil(t);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        // glibc's `-` flag drops the padding ("%-d" -> "5").
        let mut spec = chars.next().ok_or("format ends with a lone '%'")?;
        let pad = if spec == '-' {
            spec = chars.next().ok_or("format ends with '%-'")?;
            false
        } else {
            true
        };
        let num = |v: i64, w: usize| if pad { format!("{v:0w$}") } else { v.to_string() };
        let hour12 = if c.hour.is_multiple_of(12) { 12 } else { c.hour % 12 };
        let piece = match spec {
            'Y' => c.year.to_string(),
            'y' => num(c.year.rem_euclid(100), 2),
            'm' => num(c.month.into(), 2),
            'd' => num(c.day.into(), 2),
            'e' => {
                if pad {
                    format!("{:2}", c.day)
                } else {
                    c.day.to_string()
                }
            }
            'H' => num(c.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'M' => num(c.minute.into(), 2),
            'S' => num(c.second.into(), 2),
            'j' => num(c.yday.into(), 3),
            'p' => if c.hour < 12 { "AM" } else { "PM" }.to_string(),
            'a' => DAYS[c.weekday][..3].to_string(),
            'A' => DAYS[c.weekday].to_string(),
            'b' | 'h' => MONTHS[c.month as usize - 1][..3].to_string(),
            'B' => MONTHS[c.month as usize - 1].to_string(),
            'w' => c.weekday.to_string(),
            'F' => format!("{}-{:02}-{:02}", c.year, c.month, c.day),
            'T' => format!("{:02}:{:02}:{:02}", c.hour, c.minute, c.second),
            'D' => format!("{:02}/{:02}/{:02}", c.month, c.day, c.year.rem_euclid(100)),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            'n' => "\n".to_string(),
            't' => "\t".to_string(),
            '%' => "%".to_string(),
            other => return Err(format!("unsupported strftime conversion '%{other}'")),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn formats_like_c_strftime() {
        // Expected strings: Python's time.strftime(fmt, time.gmtime(secs)).
        let t = at(1_721_952_000 + 13 * 3600 + 5 * 60 + 9); // 2024-07-26 13:05:09 UTC, a Friday
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %I:%M:%S %p", t).unwrap(),
            "Friday July 26, 01:05:09 PM"
        );
        assert_eq!(
            strftime("%F %T %j %a %y %%", t).unwrap(),
            "2024-07-26 13:05:09 208 Fri 24 %"
        );
        let t = at(951_782_400); // 2000-02-29 00:00:00, leap day, Tuesday
        assert_eq!(strftime("%Y-%m-%d %a %j %e", t).unwrap(), "2000-02-29 Tue 060 29");
        assert_eq!(strftime("%d", at(0)).unwrap(), "01");
        assert!(strftime("%Q", t).unwrap_err().contains("%Q"));
        assert!(strftime("abc%", t).is_err());
    }
}
