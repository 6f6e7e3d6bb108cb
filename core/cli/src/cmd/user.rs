//! `rill user add|list|remove`: the SCRAM users of the Kafka listener's SASL
//! (`[kafka] sasl_mechanisms`), kept in the cluster's metadata quorum. A user
//! is a principal like a certificate's common name: the same ACLs apply.
//!
//! `add` reads the password from standard input (one line, `--password-stdin`)
//! and derives a SCRAM-SHA-256 and a SCRAM-SHA-512 credential here, with a
//! fresh random salt each; only those go to the broker, never the password.
//! Adding a user that exists replaces its password.

use std::io::{BufRead, IsTerminal};

use clap::{Args, Subcommand};
use rand::RngCore;
use rill_proto::scram::{ITERATIONS_DEFAULT, Mechanism, SALT_LEN, ScramCredential};

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user, or set a user's password (read from stdin).
    Add(AddArgs),
    /// List the users and their mechanisms.
    List(ListArgs),
    /// Remove a user.
    Remove(RemoveArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The user name (the principal ACLs name).
    pub name: String,
    /// Read the password from standard input (its first line).
    #[arg(long)]
    pub password_stdin: bool,
    /// PBKDF2 iterations of the credentials (4096 to 100000).
    #[arg(long, value_name = "N", default_value_t = ITERATIONS_DEFAULT)]
    pub iterations: u32,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The password: the first line of stdin, without its line ending.
fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if !from_stdin || stdin.is_terminal() {
        anyhow::bail!(
            "give the password on standard input with --password-stdin, e.g. \
             `printf '%s\\n' \"$PASSWORD\" | rill user add NAME --password-stdin` \
             (it is not read from a terminal, where it would echo)"
        );
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        anyhow::bail!("the password on standard input is empty");
    }
    Ok(password)
}

/// A SCRAM-SHA-256 and a SCRAM-SHA-512 credential of `password`.
fn credentials(password: &str, iterations: u32) -> Vec<ScramCredential> {
    Mechanism::ALL
        .into_iter()
        .map(|m| {
            let mut salt = [0u8; SALT_LEN];
            rand::rng().fill_bytes(&mut salt);
            ScramCredential::derive(m, password.as_bytes(), &salt, iterations)
        })
        .collect()
}

pub async fn run(command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Add(args) => {
            let password = read_password(args.password_stdin)?;
            let creds = credentials(&password, args.iterations);
            if let Some(why) = creds.iter().find_map(|c| c.check().err()) {
                anyhow::bail!("cannot add user {}: {why}", args.name);
            }
            let admin = args.client.connect().await?.admin();
            let existed = admin
                .set_user(&args.name, creds)
                .await
                .map_err(|e| client_error(format!("cannot add user {}", args.name), e))?;
            let what = if existed { "Password of" } else { "Added user" };
            println!("{what} {} set (SCRAM-SHA-256, SCRAM-SHA-512)", args.name);
        }
        UserCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let users = admin
                .describe_users()
                .await
                .map_err(|e| client_error("cannot list the users", e))?;
            println!("USER  MECHANISMS");
            for u in users {
                let mechanisms: Vec<String> = u
                    .mechanisms
                    .iter()
                    .map(|(m, i)| format!("{m}({i})"))
                    .collect();
                println!("{}  {}", u.name, mechanisms.join(","));
            }
        }
        UserCommand::Remove(args) => {
            let admin = args.client.connect().await?.admin();
            let existed = admin
                .set_user(&args.name, Vec::new())
                .await
                .map_err(|e| client_error(format!("cannot remove user {}", args.name), e))?;
            if !existed {
                anyhow::bail!("user {} does not exist", args.name);
            }
            println!("Removed user {}", args.name);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_credentials_verify_the_password_and_have_their_own_salts() {
        let creds = credentials("s3cret", 4096);
        assert_eq!(creds.len(), 2);
        for c in &creds {
            c.check().unwrap();
            assert!(c.verify_password(b"s3cret"));
            assert!(!c.verify_password(b"s3cre"));
        }
        assert_ne!(creds[0].salt, creds[1].salt);
    }
}
