//! `rill token issue --principal NAME --ttl 1h`: a bearer token for the web
//! console of a broker run with `--auth mtls`, signed with the CA key that signs
//! client certificates (see `rill_net::token`). The console's sign-in takes
//! it, and the console then acts as `User:NAME` under the cluster's ACLs.
//!
//! Prints only the token on stdout (for `$(...)`); when it expires, on stderr.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// The principal the console acts as (`User:NAME` in ACLs): letters,
    /// digits, '.', '_', '-' and '@', at most 64.
    #[arg(long, value_name = "NAME")]
    pub principal: String,
    /// How long the token is valid (e.g. 30m, 1h, 2days; at most 7 days).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// The CA's private key (PEM, PKCS#8) that signs the brokers' client
    /// certificates (default: the development CA's, $RILL_HOME/ca-key.pem).
    #[arg(long, value_name = "FILE")]
    pub ca_key: Option<PathBuf>,
}

pub fn run(args: IssueArgs) -> anyhow::Result<()> {
    let key = match args.ca_key {
        Some(k) => k,
        None => {
            let home = rill_net::rill_home();
            rill_net::ensure_dev_ca(&home)
                .with_context(|| format!("cannot open the development CA in {}", home.display()))?;
            home.join(rill_net::dev_ca::DEV_CA_KEY_FILE)
        }
    };
    let now = SystemTime::now();
    let token = rill_net::token::issue(&key, &args.principal, args.ttl, now)
        .with_context(|| format!("cannot issue a token for {:?}", args.principal))?;
    println!("{token}");
    let until = humantime::format_rfc3339_seconds(now + args.ttl);
    eprintln!(
        "A console token for User:{} until {until}: paste it into the console's sign-in.",
        args.principal
    );
    Ok(())
}
