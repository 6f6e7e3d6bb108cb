//! `rss-load [--bootstrap HOST:PORT] [--topic articles] FEED_FILE...`: publishes
//! the items of RSS 2.0 / Atom files to a Rill topic (see the library, src/lib.rs).

use clap::Parser;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    rss_load::run(rss_load::Args::parse()).await.map(|_| ())
}
