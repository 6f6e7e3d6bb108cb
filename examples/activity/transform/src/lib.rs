//! Website activity tracking: each input record is one page view (value = the
//! page path, e.g. `/pricing`; key = the user, so one user's views stay in one
//! partition). The transform counts views per (minute of the record's
//! timestamp, page) in transform state and writes the running count to a
//! compacted topic, key `<minute>|<page>` (minute as `YYYY-MM-DDTHH:MM`), value
//! the count — read from the beginning it is the per-minute table. The counts
//! live in the state changelog, so they survive restarts and partition moves.
//!
//! The count of a (minute, page) pair is per input partition: read the output
//! with the partition's count summed, or key the input by page to get one count.

use rill_sdk::{Output, Record};

#[rill_sdk::transform]
fn count_views(record: Record) -> Result<Output, String> {
    let page = record.value_str()?.ok_or("a page view needs the page as its value")?.trim().to_string();
    if !page.starts_with('/') {
        return Err(format!("{page:?} is not a page path (it should start with /)"));
    }
    let key = format!("{}|{page}", minute(record.timestamp_ms));
    let count = rill_sdk::state::get(&key)
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, u64::from_be_bytes)
        + 1;
    rill_sdk::state::put(&key, count.to_be_bytes());
    Ok(Output::new(count.to_string()).key(key))
}

/// `YYYY-MM-DDTHH:MM` (UTC) of a timestamp in milliseconds.
pub fn minute(timestamp_ms: i64) -> String {
    let minutes = timestamp_ms.div_euclid(60_000);
    let (days, rem) = (minutes.div_euclid(1440), minutes.rem_euclid(1440));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}", rem / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_sdk::testing;

    #[test]
    fn minutes_are_utc_calendar_minutes() {
        assert_eq!(minute(0), "1970-01-01T00:00");
        assert_eq!(minute(1_764_669_659_000), "2025-12-02T10:00");
        assert_eq!(minute(951_782_400_000), "2000-02-29T00:00");
    }

    #[test]
    fn counts_per_minute_and_page() {
        testing::reset();
        let t = 1_764_669_600_000; // 2025-12-02T10:00:00Z
        let view = |page: &str, ts: i64| Record::new(page).with_key("u").with_timestamp_ms(ts);
        let c = |o: Output| String::from_utf8(o.value.unwrap()).unwrap();
        assert_eq!(c(count_views(view("/a", t)).unwrap()), "1");
        assert_eq!(c(count_views(view("/a", t + 59_000)).unwrap()), "2");
        assert_eq!(c(count_views(view("/b", t + 1)).unwrap()), "1");
        let next = count_views(view("/a", t + 60_000)).unwrap();
        assert_eq!(next.key.as_deref(), Some(&b"2025-12-02T10:01|/a"[..]));
        assert_eq!(c(next), "1");
        assert!(count_views(view("nope", t)).is_err());
    }
}
