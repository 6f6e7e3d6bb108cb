//! `rill group list|describe|reset-offsets|delete`: consumer-group administration.
//!
//! `describe` prints a header line, the members, then one row per partition in
//! the layout of Kafka's `kafka-consumer-groups.sh --describe` (space-aligned
//! columns; `-` where there is no value):
//!
//! ```text
//! GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  MEMBER-ID
//! ```
//!
//! `reset-offsets` is refused by the coordinator while the group has members
//! (live, or static members within their session timeout).

use std::io::Write;

use anyhow::Context;
use clap::{ArgGroup, Args, Subcommand};
use rill_client::{Offset, ResetSpec};

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List consumer groups: id, state, member count.
    List(ListArgs),
    /// Describe a group: members, their partitions, committed offsets, log end offsets, lag.
    Describe(NameArgs),
    /// Move a group's committed offsets for a topic (only while the group has no members).
    ResetOffsets(ResetArgs),
    /// Delete a group and its committed offsets (only while it has no members).
    Delete(NameArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// Group id.
    pub group: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("to").required(true).args(["to_earliest", "to_latest", "to_offset", "to_datetime"])))]
pub struct ResetArgs {
    /// Group id.
    pub group: String,
    /// Topic whose partitions to reset (all of them).
    #[arg(long)]
    pub topic: String,
    /// To the first offset still kept.
    #[arg(long)]
    pub to_earliest: bool,
    /// To the log end (skip everything there is now).
    #[arg(long)]
    pub to_latest: bool,
    /// To this offset (clamped into what each partition holds).
    #[arg(long, value_name = "N")]
    pub to_offset: Option<i64>,
    /// To the first record at or after this time: RFC 3339 (2026-01-31T12:00:00Z,
    /// offsets like +02:00 allowed) or milliseconds since the Unix epoch.
    #[arg(long, value_name = "TIME", value_parser = parse_datetime_ms)]
    pub to_datetime: Option<i64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let groups = admin
                .list_groups()
                .await
                .map_err(|e| client_error("cannot list groups", e))?;
            let mut rows = vec![vec!["GROUP".into(), "STATE".into(), "MEMBERS".into()]];
            for g in groups {
                rows.push(vec![g.group_id, g.state, g.members.to_string()]);
            }
            print_out(&table(&rows))
        }
        GroupCommand::Describe(args) => {
            let admin = args.client.connect().await?.admin();
            let g = admin
                .describe_group(&args.group)
                .await
                .map_err(|e| client_error(format!("cannot describe group {}", args.group), e))?;
            let mut out = format!(
                "Group: {}  State: {}  Epoch: {}  Assignor: {}  Coordinator: {}  Members: {}\n\n",
                g.group_id,
                g.state,
                g.group_epoch,
                if g.assignor.is_empty() {
                    "-"
                } else {
                    &g.assignor
                },
                g.coordinator,
                g.members.len()
            );
            if !g.members.is_empty() {
                let mut rows = vec![vec![
                    "MEMBER-ID".to_string(),
                    "INSTANCE-ID".into(),
                    "CLIENT-ID".into(),
                    "EPOCH".into(),
                    "PARTITIONS".into(),
                    "REVOKING".into(),
                ]];
                for m in &g.members {
                    let list = |tps: &[rill_client::TopicPartition]| {
                        if tps.is_empty() {
                            "-".to_string()
                        } else {
                            tps.iter()
                                .map(|t| t.to_string())
                                .collect::<Vec<_>>()
                                .join(",")
                        }
                    };
                    rows.push(vec![
                        format!("{}{}", m.member_id, if m.left { " (left)" } else { "" }),
                        m.instance_id.clone().unwrap_or_else(|| "-".into()),
                        m.client_id.clone(),
                        m.member_epoch.to_string(),
                        list(&m.assignment),
                        list(&m.revoking),
                    ]);
                }
                out.push_str(&table(&rows));
                out.push('\n');
            }
            let dash = |o: Option<String>| o.unwrap_or_else(|| "-".into());
            let mut rows = vec![vec![
                "GROUP".to_string(),
                "TOPIC".into(),
                "PARTITION".into(),
                "CURRENT-OFFSET".into(),
                "LOG-END-OFFSET".into(),
                "LAG".into(),
                "MEMBER-ID".into(),
            ]];
            for p in &g.partitions {
                rows.push(vec![
                    g.group_id.clone(),
                    p.tp.topic.clone(),
                    p.tp.partition.to_string(),
                    dash(p.committed.map(|o| o.to_string())),
                    dash(p.log_end_offset.map(|o| o.to_string())),
                    dash(p.lag.map(|l| l.to_string())),
                    dash(p.member_id.clone()),
                ]);
            }
            out.push_str(&table(&rows));
            print_out(&out)
        }
        GroupCommand::ResetOffsets(args) => {
            let to = if args.to_earliest {
                ResetSpec::Earliest
            } else if args.to_latest {
                ResetSpec::Latest
            } else if let Some(n) = args.to_offset {
                anyhow::ensure!(
                    n >= 0,
                    "cannot reset group {}: --to-offset {n} is negative. Pass an offset >= 0",
                    args.group
                );
                ResetSpec::Offset(Offset(n))
            } else {
                ResetSpec::Timestamp(args.to_datetime.expect("clap requires one --to-*"))
            };
            let admin = args.client.connect().await?.admin();
            let offsets = admin
                .reset_offsets(&args.group, &args.topic, to)
                .await
                .map_err(|e| {
                    client_error(
                        format!(
                            "cannot reset the offsets of group {} on topic {}",
                            args.group, args.topic
                        ),
                        e,
                    )
                })?;
            let mut rows = vec![vec![
                "GROUP".to_string(),
                "TOPIC".into(),
                "PARTITION".into(),
                "NEW-OFFSET".into(),
            ]];
            for (tp, o) in offsets {
                rows.push(vec![
                    args.group.clone(),
                    tp.topic,
                    tp.partition.to_string(),
                    o.to_string(),
                ]);
            }
            print_out(&table(&rows))
        }
        GroupCommand::Delete(args) => {
            let admin = args.client.connect().await?.admin();
            admin
                .delete_group(&args.group)
                .await
                .map_err(|e| client_error(format!("cannot delete group {}", args.group), e))?;
            print_out(&format!("Deleted group {}.\n", args.group))
        }
    }
}

/// Space-aligned columns (two spaces between), one row per line.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; cols];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn print_out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `--to-datetime`: milliseconds since the epoch, or RFC 3339
/// (`YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`, a space allowed for `T`).
pub fn parse_datetime_ms(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || {
        format!(
            "invalid time {s:?}: use RFC 3339 like 2026-01-31T12:00:00Z (or +02:00), or milliseconds since the Unix epoch"
        )
    };
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let num = |from: usize, to: usize| -> Result<i64, String> {
        s.get(from..to)
            .filter(|p| p.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|p| p.parse().ok())
            .ok_or_else(bad)
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut at = 19;
    let mut millis = 0i64;
    if b.get(at) == Some(&b'.') {
        let start = at + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        if end == start {
            return Err(bad());
        }
        let digits = &s[start..end.min(start + 3)];
        millis = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
        at = end;
    }
    let offset_min = match &s[at..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6
            && matches!(tz.as_bytes()[0], b'+' | b'-')
            && tz.as_bytes()[3] == b':' =>
        {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (num(at + 1, at + 3)? * 60 + num(at + 4, at + 6)?)
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60;
    Ok(secs * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_parse() {
        assert_eq!(parse_datetime_ms("0").unwrap(), 0);
        assert_eq!(parse_datetime_ms("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(
            parse_datetime_ms("2026-12-02T16:00:00.5Z").unwrap(),
            1_796_227_200_500
        );
        assert_eq!(
            parse_datetime_ms("2026-12-02T18:00:00+02:00").unwrap(),
            1_796_227_200_000
        );
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-02T16:00:00",
            "2026-12-02",
        ] {
            let e = parse_datetime_ms(bad).unwrap_err();
            assert!(e.contains("RFC 3339"), "{e}");
        }
    }

    #[test]
    fn tables_align() {
        let t = table(&[
            vec!["A".into(), "LONG".into(), "X".into()],
            vec!["abc".into(), "1".into(), "-".into()],
        ]);
        assert_eq!(t, "A    LONG  X\nabc  1     -\n");
    }
}
