//! Time as Kubernetes writes it.

use std::time::{SystemTime, UNIX_EPOCH};

/// RFC 3339 in UTC, to the second, as Kubernetes writes timestamps.
pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Now in RFC 3339 with microseconds (`MicroTime`, as Leases carry).
pub fn rfc3339_micro_now() -> String {
    rfc3339_micro(SystemTime::now())
}

/// `at` in RFC 3339 with microseconds (`MicroTime`).
pub fn rfc3339_micro(at: SystemTime) -> String {
    let d = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!(
        "{}.{:06}Z",
        rfc3339(d.as_secs() as i64).trim_end_matches('Z'),
        d.subsec_micros()
    )
}

/// Seconds since the epoch.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
