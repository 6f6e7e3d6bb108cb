//! `rill txn list|describe`: the transactions the cluster's coordinators hold
//! (what Kafka's `kafka-transactions.sh list` and `describe` show), for
//! finding a transaction that holds a partition's last stable offset back.

use clap::{Args, Subcommand};

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum TxnCommand {
    /// List the transactional ids every broker coordinates, with their state.
    List(ListArgs),
    /// Show one transactional id's state, producer and open partitions.
    Describe(DescribeArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only these states (Empty, Ongoing, PrepareCommit, PrepareAbort,
    /// CompleteCommit, CompleteAbort); repeatable.
    #[arg(long = "state", value_name = "STATE")]
    pub states: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The transactional id.
    pub transactional_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(command: TxnCommand) -> anyhow::Result<()> {
    match command {
        TxnCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let listed = admin
                .list_transactions(&args.states)
                .await
                .map_err(|e| client_error("cannot list the transactions", e))?;
            println!("TRANSACTIONAL-ID  PRODUCER-ID  STATE");
            for t in listed {
                println!("{}  {}  {}", t.transactional_id, t.producer_id, t.state);
            }
        }
        TxnCommand::Describe(args) => {
            let admin = args.client.connect().await?.admin();
            let d = admin
                .describe_transaction(&args.transactional_id)
                .await
                .map_err(|e| {
                    client_error(format!("cannot describe {:?}", args.transactional_id), e)
                })?;
            println!("transactional id: {}", d.transactional_id);
            println!("state:            {}", d.state);
            println!(
                "producer:         {} (epoch {})",
                d.producer_id, d.producer_epoch
            );
            println!("timeout:          {} ms", d.timeout_ms);
            if d.start_ms >= 0 {
                let open_ms = rill_proto::types::now_ms().saturating_sub(d.start_ms);
                println!("open for:         {open_ms} ms");
            }
            let partitions: Vec<String> = d
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| format!("{}-{p}", t.topic)))
                .collect();
            println!(
                "partitions:       {}",
                if partitions.is_empty() {
                    "-".to_string()
                } else {
                    partitions.join(", ")
                }
            );
        }
    }
    Ok(())
}
