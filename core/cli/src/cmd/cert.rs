//! `rill cert issue`: a client (or broker) certificate from the development CA
//! in $RILL_HOME, for brokers run with `--auth mtls`.
//!
//! Writes `NAME.pem` and `NAME-key.pem` (mode 0600) into `--out` (default
//! `$RILL_HOME/certs`) and prints the flags a client passes to use them.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("who").required(true).multiple(false))]
pub struct IssueArgs {
    /// The principal the certificate names (its common name): letters,
    /// digits, '.', '_', '-' and '@', at most 64.
    #[arg(long, value_name = "NAME", group = "who")]
    pub principal: Option<String>,
    /// Issue broker ID's certificate instead (for brokers run with their own
    /// certificate files: it carries the broker mark other brokers trust).
    #[arg(long, value_name = "ID", group = "who")]
    pub broker: Option<i32>,
    /// DNS names or IP addresses a broker certificate is valid for, besides
    /// localhost, 127.0.0.1 and ::1 (repeatable).
    #[arg(long = "name", value_name = "HOST", requires = "broker")]
    pub names: Vec<String>,
    /// Where to write the files (default: $RILL_HOME/certs).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn run(args: IssueArgs) -> anyhow::Result<()> {
    let home = rill_net::rill_home();
    let ca = rill_net::ensure_dev_ca(&home)
        .with_context(|| format!("cannot open the development CA in {}", home.display()))?;
    let out = args.out.clone().unwrap_or_else(|| home.join("certs"));
    let (file_name, chain, key) = match (&args.principal, args.broker) {
        (Some(name), _) => {
            let (chain, key) = ca
                .issue_client_cert(name)
                .with_context(|| format!("cannot issue a certificate for {name:?}"))?;
            (name.clone(), chain, key)
        }
        (None, Some(id)) => {
            anyhow::ensure!(id >= 0, "a broker id is >= 0, got {id}");
            let (chain, key) = ca
                .issue_broker_cert(id, &args.names)
                .with_context(|| format!("cannot issue broker {id}'s certificate"))?;
            (format!("broker-{id}"), chain, key)
        }
        (None, None) => unreachable!("clap requires --principal or --broker"),
    };
    let (cert, key) = rill_net::write_cert_files(&out, &file_name, &chain, &key)
        .with_context(|| format!("cannot write the certificate into {}", out.display()))?;
    println!("Wrote {} and {}", cert.display(), key.display());
    match args.principal {
        Some(name) => println!(
            "Connect as {name:?} with: --tls-cert {} --tls-key {} (or RILL_TLS_CERT / RILL_TLS_KEY)",
            cert.display(),
            key.display()
        ),
        None => println!(
            "Start the broker with: --tls-cert {} --tls-key {} --tls-ca {}",
            cert.display(),
            key.display(),
            ca.cert_path().display()
        ),
    }
    Ok(())
}
