//! `rill cluster info`: the cluster id and its brokers.
//!
//! Output:
//!
//! ```text
//! Cluster: <cluster id>
//! ID  ADDRESS          ALIVE  CONTROLLER
//! 1   127.0.0.1:9092   yes    *
//! ```

use std::io::Write;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// List the brokers (id, address, alive, controller marker) and the cluster id.
    Info(InfoArgs),
    /// Move partition leadership back to each partition's preferred (first) replica.
    ElectLeaders(ElectArgs),
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Only this topic (repeatable); default: every topic.
    #[arg(long = "topic", value_name = "NAME")]
    pub topics: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::ElectLeaders(args) => {
            let client = args.client.connect().await?;
            let req = rill_proto::wire::ElectLeadersRequest {
                topics: (!args.topics.is_empty()).then_some(args.topics),
            };
            let (resp, _) = client
                .call(None, &req, &[])
                .await
                .map_err(|e| client_error("cannot run the preferred leader election", e))?;
            if resp.moved.is_empty() {
                println!(
                    "Every partition is led by its preferred replica (or it is not in the ISR)."
                );
            } else {
                for tp in resp.moved {
                    println!("Moved leadership of {tp} to its preferred replica");
                }
            }
            Ok(())
        }
        ClusterCommand::Info(args) => {
            let admin = args.client.connect().await?.admin();
            let info = admin
                .cluster()
                .await
                .map_err(|e| client_error("cannot read the cluster metadata", e))?;
            let brokers: Vec<BrokerRow> = info
                .brokers
                .iter()
                .map(|b| BrokerRow {
                    id: b.id,
                    addr: b.addr.clone(),
                    alive: b.alive,
                    controller: info.controller_id == Some(b.id),
                })
                .collect();
            let text = format_info(&info.cluster_id, &brokers);
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => other.context("cannot write to stdout"),
            }
        }
    }
}

/// One broker as `cluster info` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRow {
    pub id: i32,
    pub addr: String,
    pub alive: bool,
    pub controller: bool,
}

/// Renders the cluster id and a column-aligned broker table.
pub fn format_info(cluster_id: &str, brokers: &[BrokerRow]) -> String {
    let addr_width = brokers
        .iter()
        .map(|b| b.addr.len())
        .max()
        .unwrap_or(0)
        .max("ADDRESS".len());
    let id_width = brokers
        .iter()
        .map(|b| b.id.to_string().len())
        .max()
        .unwrap_or(0)
        .max("ID".len());
    let mut out = format!("Cluster: {cluster_id}\n");
    out.push_str(&format!(
        "{:<id_width$}  {:<addr_width$}  ALIVE  CONTROLLER\n",
        "ID", "ADDRESS"
    ));
    for b in brokers {
        out.push_str(
            format!(
                "{:<id_width$}  {:<addr_width$}  {:<5}  {}",
                b.id,
                b.addr,
                if b.alive { "yes" } else { "no" },
                if b.controller { "*" } else { "" }
            )
            .trim_end(),
        );
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_table() {
        let rows = vec![
            BrokerRow {
                id: 1,
                addr: "127.0.0.1:9092".into(),
                alive: true,
                controller: true,
            },
            BrokerRow {
                id: 10,
                addr: "10.0.0.2:9092".into(),
                alive: false,
                controller: false,
            },
        ];
        assert_eq!(
            format_info("c1", &rows),
            "Cluster: c1\n\
             ID  ADDRESS         ALIVE  CONTROLLER\n\
             1   127.0.0.1:9092  yes    *\n\
             10  10.0.0.2:9092   no\n"
        );
    }
}
