//! Derives `user-countries` (key = user id, value = country code) from the
//! compacted changelog `user-profiles` (key = user id, value = the profile as
//! JSON, a tombstone when the user is deleted).
//!
//! A profile update writes the user's country; a tombstone writes a tombstone,
//! so the derived compacted topic, read from the beginning, holds exactly the
//! countries of the users that exist. A profile without a key, or one that is
//! not JSON, is an error (dead-lettered by the deployment).

use rill_sdk::{Output, Record};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Profile {
    country: Option<String>,
}

#[rill_sdk::transform]
fn profile_country(record: Record) -> Result<Output, String> {
    let key = record.key.clone().ok_or("a profile record needs the user id as its key")?;
    let Some(value) = &record.value else {
        return Ok(Output::tombstone(key));
    };
    let profile: Profile =
        serde_json::from_slice(value).map_err(|e| format!("the profile is not JSON: {e}"))?;
    Ok(match profile.country {
        Some(c) if !c.trim().is_empty() => Output::new(c.trim().to_uppercase()).key(key),
        // No country any more: the user leaves the derived table.
        _ => Output::tombstone(key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_write_the_country_and_tombstones_delete() {
        let out = profile_country(Record::new(r#"{"name":"Ada","country":"gb"}"#).with_key("u1")).unwrap();
        assert_eq!(out.key.as_deref(), Some(&b"u1"[..]));
        assert_eq!(out.value.as_deref(), Some(&b"GB"[..]));
        let gone = profile_country(Record::tombstone("u1")).unwrap();
        assert_eq!(gone.key.as_deref(), Some(&b"u1"[..]));
        assert_eq!(gone.value, None);
        let none = profile_country(Record::new(r#"{"name":"Ada"}"#).with_key("u1")).unwrap();
        assert_eq!(none.value, None);
        assert!(profile_country(Record::new("{")).is_err());
    }
}
