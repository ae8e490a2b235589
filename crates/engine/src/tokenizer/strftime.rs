//! `strftime_now(format)` for chat templates: transformers gives templates this function
//! (LLaMA 3.1/3.2's put "Today Date: 27 Nov 2026" in the system header with it); without it
//! they fall back to a fixed date, and the prompt differs from transformers' and vLLM's.
//! Dates are UTC; the directives are C's common ones.

/// `unix_secs` (seconds since 1970-01-01 UTC) formatted by `format`: `%d %e %m %y %Y %b %B %a
/// %A %H %M %S %j %%`; another directive is kept as written.
pub fn strftime(format: &str, unix_secs: i64) -> String {
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
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let (days, secs) = (unix_secs.div_euclid(86_400), unix_secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[month as usize - 1] + day + u32::from(leap && month > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('Y') => out.push_str(&year.to_string()),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The current time as seconds since 1970-01-01 UTC.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against Python's `datetime.fromtimestamp(t, timezone.utc).strftime(...)` (the values
    /// below were printed by it): the epoch, two 29 Februaries, a 2026 date, the last second
    /// of 2099.
    #[test]
    fn formats_equal_pythons() {
        let format = "%d %b %Y|%Y-%m-%d %H:%M:%S|%a %A %B %y %j %e %%";
        for (t, python) in [
            (0, "01 Jan 1970|1970-01-01 00:00:00|Thu Thursday January 70 001  1 %"),
            (951_782_400, "29 Feb 2000|2000-02-29 00:00:00|Tue Tuesday February 00 060 29 %"),
            (1_790_000_000, "21 Sep 2026|2026-09-21 14:13:20|Mon Monday September 26 264 21 %"),
            (4_102_444_799, "31 Dec 2099|2099-12-31 23:59:59|Thu Thursday December 99 365 31 %"),
            (1_709_251_199, "29 Feb 2024|2024-02-29 23:59:59|Thu Thursday February 24 060 29 %"),
        ] {
            assert_eq!(strftime(format, t), python, "t = {t}");
        }
        assert_eq!(strftime("%Q and %", 0), "%Q and %");
    }

    /// Every day of 1970-2100 in order: days and months step as a calendar does.
    #[test]
    fn days_step_through_the_calendar() {
        let (mut year, mut month, mut day) = (1970i64, 1u32, 1u32);
        for days in 0..47_847 {
            assert_eq!(civil_from_days(days), (year, month, day), "day {days}");
            let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
            let len = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month as usize - 1];
            day += 1;
            if day > len {
                (day, month) = (1, month + 1);
                if month > 12 {
                    (month, year) = (1, year + 1);
                }
            }
        }
    }
}
