//! `strftime_now(format)`, which transformers gives templates (Llama 3.x and others print
//! today's date into the system prompt): the current time formatted as C's `strftime` in the C
//! locale formats it, which is what Python's `datetime.now().strftime` ends up calling.
//!
//! The time is UTC. transformers uses the host's local zone; reading the zone database is
//! outside this module, and a prompt should not change with the zone of the machine serving it.
//! This file owns calendar arithmetic and directive formatting only; it must not read the
//! environment or depend on a date crate.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const WEEKDAYS: [&str; 7] = [
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

/// The template function.
pub(super) fn strftime_now(format: &str) -> String {
    let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs() as i64,
        Err(before) => -(before.duration().as_secs() as i64),
    };
    format_utc(format, secs)
}

/// A UTC instant broken down into calendar fields.
#[derive(Debug, PartialEq, Eq)]
struct Civil {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Sunday
    weekday: u32,
    /// 0-based day of the year
    yday: u32,
    unix: i64,
}

impl Civil {
    fn from_unix(unix: i64) -> Self {
        let days = unix.div_euclid(86_400);
        let secs = unix.rem_euclid(86_400) as u32;
        // Howard Hinnant's days-to-civil: shift the year to start in March so the leap day is last.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const BEFORE_MONTH: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = BEFORE_MONTH[(month - 1) as usize] + day - 1 + u32::from(leap && month > 2);
        Civil {
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as u32,
            yday,
            unix,
        }
    }
}

/// Formats `unix` (seconds since the epoch, UTC). Supports the C-locale directives, glibc's `-`
/// flag (no padding: `%-d`), `%e`, `%s` and `%%`; an unknown directive is copied as written, as
/// glibc does.
pub fn format_utc(format: &str, unix: i64) -> String {
    let t = Civil::from_unix(unix);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = chars.next();
        }
        let Some(spec) = spec else {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            break;
        };
        if !directive(&mut out, spec, no_pad, &t) {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            out.push(spec);
        }
    }
    out
}

/// Writes one directive; false when `spec` is not one.
fn directive(out: &mut String, spec: char, no_pad: bool, t: &Civil) -> bool {
    let num = |out: &mut String, value: i64, width: usize, fill: char| {
        if no_pad {
            let _ = write!(out, "{value}");
        } else if fill == ' ' {
            let _ = write!(out, "{value:>width$}");
        } else {
            let _ = write!(out, "{value:0width$}");
        }
    };
    let hour12 = match t.hour % 12 {
        0 => 12,
        h => h,
    };
    let weekday = WEEKDAYS[t.weekday as usize];
    let month = MONTHS[(t.month - 1) as usize];
    match spec {
        'a' => out.push_str(&weekday[..3]),
        'A' => out.push_str(weekday),
        'b' | 'h' => out.push_str(&month[..3]),
        'B' => out.push_str(month),
        'C' => num(out, t.year.div_euclid(100), 2, '0'),
        'd' => num(out, t.day.into(), 2, '0'),
        'e' => num(out, t.day.into(), 2, ' '),
        'H' => num(out, t.hour.into(), 2, '0'),
        'I' => num(out, hour12.into(), 2, '0'),
        'j' => num(out, (t.yday + 1).into(), 3, '0'),
        'm' => num(out, t.month.into(), 2, '0'),
        'M' => num(out, t.minute.into(), 2, '0'),
        'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
        'S' => num(out, t.second.into(), 2, '0'),
        's' => {
            let _ = write!(out, "{}", t.unix);
        }
        'u' => num(out, (if t.weekday == 0 { 7 } else { t.weekday }).into(), 1, '0'),
        'w' => num(out, t.weekday.into(), 1, '0'),
        'y' => num(out, t.year.rem_euclid(100), 2, '0'),
        'Y' => num(out, t.year, 1, '0'),
        'Z' => out.push_str("UTC"),
        'z' => out.push_str("+0000"),
        'n' => out.push('\n'),
        't' => out.push('\t'),
        '%' => out.push('%'),
        // The C locale's composite formats.
        'c' => out.push_str(&format_utc("%a %b %e %H:%M:%S %Y", t.unix)),
        'D' | 'x' => out.push_str(&format_utc("%m/%d/%y", t.unix)),
        'F' => out.push_str(&format_utc("%Y-%m-%d", t.unix)),
        'R' => out.push_str(&format_utc("%H:%M", t.unix)),
        'r' => out.push_str(&format_utc("%I:%M:%S %p", t.unix)),
        'T' | 'X' => out.push_str(&format_utc("%H:%M:%S", t.unix)),
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected strings are what Python's datetime.fromtimestamp(t, timezone.utc).strftime writes
    // on glibc.
    #[test]
    fn common_directives_match_python_strftime() {
        // 2024-02-29 13:05:09 UTC, a Thursday in a leap year.
        let t = 1_709_211_909;
        assert_eq!(format_utc("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(format_utc("%B %-d, %Y", t), "February 29, 2024");
        assert_eq!(format_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            format_utc("%a %A %I %p %j %y %e %u %w", t),
            "Thu Thursday 01 PM 060 24 29 4 4"
        );
        assert_eq!(
            format_utc("%c|%F|%T|%D|%Z %z|%s", t),
            "Thu Feb 29 13:05:09 2024|2024-02-29|13:05:09|02/29/24|UTC +0000|1709211909"
        );
        assert_eq!(format_utc("100%% %Q %", t), "100% %Q %");
    }

    #[test]
    fn the_calendar_is_right_at_its_edges() {
        assert_eq!(format_utc("%Y-%m-%d %A %j", 0), "1970-01-01 Thursday 001");
        assert_eq!(format_utc("%Y-%m-%d %H:%M:%S %A", -1), "1969-12-31 23:59:59 Wednesday");
        assert_eq!(format_utc("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
        assert_eq!(format_utc("%Y-%m-%d %j", 978_220_800), "2000-12-31 366");
        assert_eq!(format_utc("%Y-%m-%d %j %A", 4_102_444_800), "2100-01-01 001 Friday");
        assert_eq!(format_utc("%-d/%-m %e", 1_704_153_600), "2/1  2");
    }

    #[test]
    fn strftime_now_formats_the_current_year() {
        let year: i64 = strftime_now("%Y").parse().unwrap();
        assert!(year >= 2024, "{year}");
    }
}
