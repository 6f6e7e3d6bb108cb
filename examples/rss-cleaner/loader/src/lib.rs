//! rss-load: reads RSS 2.0 / Atom feed files and publishes one record per item
//! to a Rill topic (default `articles`): key = the item's guid (or link); value =
//! JSON `{"title", "link", "published", "content"}` with the content as the raw
//! HTML the feed carried (the RSS cleaner transform cleans it).
//!
//! Usage: `rss-load [--bootstrap HOST:PORT] [--topic articles] FEED_FILE...`.
//! The topic is created (3 partitions) if it does not exist. Prints one summary
//! line per file and exits non-zero if a file cannot be parsed.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use rill_client::{Client, ClientConfig, ErrorCode, NewTopic, ProducerConfig, ProducerRecord};

/// Publish the items of feed files to a Rill topic.
#[derive(Debug, Parser)]
#[command(name = "rss-load")]
pub struct Args {
    /// A broker, HOST:PORT (UDP).
    #[arg(long, env = "RILL_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// The topic to publish to.
    #[arg(long, default_value = "articles")]
    pub topic: String,
    /// The CA certificate (PEM) to trust; default: the development CA in $RILL_HOME.
    #[arg(long, env = "RILL_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// RSS 2.0 or Atom files.
    #[arg(required = true, value_name = "FEED_FILE")]
    pub feeds: Vec<PathBuf>,
}

/// One feed item as published.
fn item_json(entry: &feed_rs::model::Entry) -> serde_json::Value {
    let link = entry.links.first().map(|l| l.href.clone());
    let content = entry
        .content
        .as_ref()
        .and_then(|c| c.body.clone())
        .or_else(|| entry.summary.as_ref().map(|s| s.content.clone()));
    serde_json::json!({
        "title": entry.title.as_ref().map(|t| t.content.clone()),
        "link": link,
        "published": entry.published.or(entry.updated).map(|t| t.to_rfc3339()),
        "content": content,
    })
}

/// Loads every feed file; returns the number of records published.
pub async fn run(args: Args) -> anyhow::Result<usize> {
    let mut config = ClientConfig::new(args.bootstrap.clone());
    if let Some(ca) = &args.tls_ca {
        config.tls = rill_net::ClientTls::CaFile(ca.clone());
    }
    let client = Client::connect(config).await.with_context(|| {
        format!(
            "cannot connect to {}: is `rill broker` running?",
            args.bootstrap
        )
    })?;
    let created = client
        .admin()
        .create_topic(NewTopic {
            name: args.topic.clone(),
            partitions: Some(3),
            replication_factor: None,
            configs: vec![],
        })
        .await;
    match created {
        Ok(()) => {}
        Err(e) if e.code() == Some(ErrorCode::TopicAlreadyExists) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create topic {}", args.topic)),
    }
    let producer = client.producer(ProducerConfig::default())?;
    let mut failed = 0;
    let mut published = 0;
    for path in &args.feeds {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                failed += 1;
                continue;
            }
        };
        let feed = match feed_rs::parser::parse(bytes.as_slice()) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {} is not an RSS or Atom feed: {e}", path.display());
                failed += 1;
                continue;
            }
        };
        let mut pending = Vec::with_capacity(feed.entries.len());
        for entry in &feed.entries {
            let key = if entry.id.is_empty() {
                entry
                    .links
                    .first()
                    .map(|l| l.href.clone())
                    .unwrap_or_default()
            } else {
                entry.id.clone()
            };
            let value = serde_json::to_vec(&item_json(entry))?;
            pending.push(
                producer
                    .send(ProducerRecord::new(args.topic.clone(), value).key(key))
                    .await?,
            );
        }
        for p in pending {
            p.await?;
        }
        published += feed.entries.len();
        println!(
            "{}: {} items -> {}",
            path.display(),
            feed.entries.len(),
            args.topic
        );
    }
    producer.close().await?;
    if failed > 0 {
        bail!(
            "{failed} of {} feed files could not be loaded",
            args.feeds.len()
        );
    }
    Ok(published)
}
