//! Cron schedules as CronJobs write them: five fields (minute, hour, day of month, month,
//! day of week) with `*`, lists, ranges, steps and names, or a macro (`@hourly`, `@daily`,
//! `@weekly`, `@monthly`, `@yearly`), evaluated in a time zone.

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Day of month and day of week were both restricted: either may match (cron's rule).
    either_day: bool,
}

fn field(text: &str, min: u32, max: u32, names: &[&str]) -> Result<u64, String> {
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .map_err(|_| format!("bad step in {part:?}"))?,
            ),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("a step of 0 in {part:?}"));
        }
        let value = |s: &str| -> Result<u32, String> {
            if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
                return Ok(i as u32 + min);
            }
            s.parse::<u32>()
                .map_err(|_| format!("{s:?} is not a number"))
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            (v, if part.contains('/') { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{part:?} is outside {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl Schedule {
    /// Parses a schedule; the error says which field is wrong.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t => t,
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!(
                "a schedule has 5 fields (minute hour day-of-month month day-of-week), {text:?} has {}",
                f.len()
            ));
        }
        const MONTHS: &[&str] = &[
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ];
        const DAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
        Ok(Schedule {
            minutes: field(f[0], 0, 59, &[]).map_err(|e| format!("minute: {e}"))?,
            hours: field(f[1], 0, 23, &[]).map_err(|e| format!("hour: {e}"))? as u32,
            days: field(f[2], 1, 31, &[]).map_err(|e| format!("day of month: {e}"))? as u32,
            months: field(f[3], 1, 12, MONTHS).map_err(|e| format!("month: {e}"))? as u16,
            // Sunday may be written 0 or 7.
            weekdays: {
                let b = field(f[4], 0, 7, DAYS).map_err(|e| format!("day of week: {e}"))?;
                ((b | (b >> 7)) & 0x7f) as u8
            },
            either_day: !f[2].starts_with('*') && !f[4].starts_with('*'),
        })
    }

    fn matches(&self, t: &DateTime) -> bool {
        let dom = self.days & (1 << t.day()) != 0;
        let dow = self.weekdays & (1 << t.weekday().to_sunday_zero_offset()) != 0;
        let day = if self.either_day {
            dom || dow
        } else {
            dom && dow
        };
        self.minutes & (1 << t.minute()) != 0
            && self.hours & (1 << t.hour()) != 0
            && self.months & (1 << t.month()) != 0
            && day
    }

    /// The first time after `after` (exclusive) the schedule fires, in `tz`; None within
    /// five years (a schedule like `0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = after.to_zoned(tz.clone()).datetime();
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        // Minute by minute is at most 2.6 M steps for five years; skip whole hours and days
        // that cannot match to keep it quick.
        for _ in 0..2_000_000 {
            if self.months & (1 << t.month()) == 0 || !self.day_ok(&t) {
                t = t
                    .date()
                    .checked_add(1.day())
                    .ok()?
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.matches(&t) {
                return t.to_zoned(tz.clone()).ok().map(|z| z.timestamp());
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }

    fn day_ok(&self, t: &DateTime) -> bool {
        let dom = self.days & (1 << t.day()) != 0;
        let dow = self.weekdays & (1 << t.weekday().to_sunday_zero_offset()) != 0;
        if self.either_day {
            dom || dow
        } else {
            dom && dow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn next_times() {
        let utc = TimeZone::UTC;
        let cases = [
            (
                "*/15 * * * *",
                "2026-01-01T10:07:00Z",
                "2026-01-01T10:15:00Z",
            ),
            (
                "0 9 * * 1-5",
                "2026-01-02T09:00:00Z",
                "2026-01-05T09:00:00Z",
            ),
            ("@daily", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            (
                "30 2 1 jan,jul *",
                "2026-01-01T02:30:00Z",
                "2026-07-01T02:30:00Z",
            ),
            ("0 0 * * 7", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"),
            ("0 0 13 * 5", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            ("* * * * *", "2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"),
        ];
        for (s, after, want) in cases {
            let sched = Schedule::parse(s).expect(s);
            assert_eq!(
                sched.next_after(ts(after), &utc),
                Some(ts(want)),
                "{s} after {after}"
            );
        }
        let ny = TimeZone::get("America/New_York").expect("tz");
        let s = Schedule::parse("0 9 * * *").expect("parse");
        assert_eq!(
            s.next_after(ts("2026-01-01T00:00:00Z"), &ny),
            Some(ts("2026-01-01T14:00:00Z"))
        );
        assert_eq!(
            Schedule::parse("0 0 30 2 *")
                .expect("parse")
                .next_after(ts("2026-01-01T00:00:00Z"), &utc),
            None
        );
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (s, want) in [
            ("* * * *", "5 fields"),
            ("61 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day of month"),
            ("* * * foo *", "month"),
            ("*/0 * * * *", "step of 0"),
        ] {
            let e = Schedule::parse(s).expect_err(s);
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
