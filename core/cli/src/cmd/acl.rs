//! `rill acl add|list|remove` and `rill quota set|list`: the access-control
//! rules and byte-rate quotas kept in the cluster's metadata quorum (every
//! broker enforces them with `--auth mtls`; they survive restarts and
//! controller changes).
//!
//! Output of `rill acl list`, one rule per line, sorted:
//!
//! ```text
//! PRINCIPAL  OPERATION  RESOURCE
//! alice      read       topic orders
//! ```

use clap::{Args, Subcommand};
use rill_proto::wire::{AclOperation, AclResource, AclRule, Quota};

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Allow a principal an operation on a resource.
    Add(RuleArgs),
    /// List the rules (of one principal, or all).
    List(ListArgs),
    /// Remove a rule (the same flags as `add`).
    Remove(RuleArgs),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("resource").required(true).multiple(false))]
pub struct RuleArgs {
    /// The principal (a client certificate's common name), or * for every
    /// authenticated principal.
    #[arg(long, value_name = "NAME")]
    pub principal: String,
    /// read, write, create, delete, alter, describe or all.
    #[arg(long, value_name = "OP", value_parser = parse_operation)]
    pub operation: AclOperation,
    /// One topic.
    #[arg(long, value_name = "NAME", group = "resource")]
    pub topic: Option<String>,
    /// Every topic whose name starts with PREFIX.
    #[arg(long, value_name = "PREFIX", group = "resource")]
    pub topic_prefix: Option<String>,
    /// A consumer group.
    #[arg(long, value_name = "ID", group = "resource")]
    pub group: Option<String>,
    /// A transform.
    #[arg(long, value_name = "NAME", group = "resource")]
    pub transform: Option<String>,
    /// The cluster (create any topic, ACLs and quotas, leader elections).
    #[arg(long, group = "resource")]
    pub cluster: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this principal's rules.
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

fn parse_operation(s: &str) -> Result<AclOperation, String> {
    AclOperation::parse(&s.to_ascii_lowercase()).ok_or_else(|| {
        format!(
            "unknown operation {s:?}: use one of {}",
            AclOperation::ALL.map(AclOperation::name).join(", ")
        )
    })
}

impl RuleArgs {
    fn rule(&self) -> AclRule {
        let resource = if let Some(t) = &self.topic {
            AclResource::Topic(t.clone())
        } else if let Some(p) = &self.topic_prefix {
            AclResource::TopicPrefix(p.clone())
        } else if let Some(g) = &self.group {
            AclResource::Group(g.clone())
        } else if let Some(n) = &self.transform {
            AclResource::Transform(n.clone())
        } else {
            AclResource::Cluster
        };
        AclRule {
            principal: self.principal.clone(),
            operation: self.operation,
            resource,
        }
    }
}

/// How a rule's resource reads in `rill acl list`.
fn resource_text(r: &AclResource) -> String {
    match r {
        AclResource::Topic(t) => format!("topic {t}"),
        AclResource::TopicPrefix(p) => format!("topic-prefix {p}"),
        AclResource::Group(g) => format!("group {g}"),
        AclResource::Transform(n) => format!("transform {n}"),
        AclResource::Cluster => "cluster".into(),
    }
}

/// The table `rill acl list` prints.
pub fn format_rules(rules: &[AclRule]) -> String {
    let rows: Vec<[String; 3]> = rules
        .iter()
        .map(|r| {
            [
                r.principal.clone(),
                r.operation.name().to_string(),
                resource_text(&r.resource),
            ]
        })
        .collect();
    let width = |i: usize, head: &str| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([head.len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1) = (width(0, "PRINCIPAL"), width(1, "OPERATION"));
    let mut out = format!("{:w0$}  {:w1$}  RESOURCE\n", "PRINCIPAL", "OPERATION");
    for r in rows {
        out.push_str(&format!("{:w0$}  {:w1$}  {}\n", r[0], r[1], r[2]));
    }
    out
}

pub async fn run(command: AclCommand) -> anyhow::Result<()> {
    match command {
        AclCommand::Add(args) => {
            let rule = args.rule();
            let admin = args.client.connect().await?.admin();
            let created = admin
                .create_acls(vec![rule.clone()])
                .await
                .map_err(|e| client_error("cannot add the ACL rule", e))?;
            if created == 0 {
                println!("Rule exists already: {rule}");
            } else {
                println!("Added rule: {rule}");
            }
        }
        AclCommand::Remove(args) => {
            let rule = args.rule();
            let admin = args.client.connect().await?.admin();
            let deleted = admin
                .delete_acls(vec![rule.clone()])
                .await
                .map_err(|e| client_error("cannot remove the ACL rule", e))?;
            if deleted == 0 {
                anyhow::bail!("no such rule: {rule} (see `rill acl list`)");
            }
            println!("Removed rule: {rule}");
        }
        AclCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let rules = admin
                .describe_acls(args.principal.as_deref())
                .await
                .map_err(|e| client_error("cannot list the ACL rules", e))?;
            print!("{}", format_rules(&rules));
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set a principal's byte-rate quotas (the broker delays its answers to
    /// keep the principal under them).
    Set(QuotaSetArgs),
    /// List the quotas.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct QuotaSetArgs {
    #[arg(long, value_name = "NAME")]
    pub principal: String,
    /// Produce bytes per second (Kafka's producer_byte_rate); 0 or unset: none.
    #[arg(long, value_name = "N")]
    pub produce_bytes_per_s: Option<u64>,
    /// Fetch bytes per second (Kafka's consumer_byte_rate); 0 or unset: none.
    #[arg(long, value_name = "N")]
    pub fetch_bytes_per_s: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

fn rate_text(rate: Option<u64>) -> String {
    rate.map_or("-".into(), |r| r.to_string())
}

pub async fn run_quota(command: QuotaCommand) -> anyhow::Result<()> {
    match command {
        QuotaCommand::Set(args) => {
            let quota = Quota {
                produce_bytes_per_s: args.produce_bytes_per_s.filter(|r| *r > 0),
                fetch_bytes_per_s: args.fetch_bytes_per_s.filter(|r| *r > 0),
            };
            let admin = args.client.connect().await?.admin();
            admin
                .set_quota(&args.principal, quota.clone())
                .await
                .map_err(|e| client_error("cannot set the quota", e))?;
            println!(
                "Quota of {}: produce {} bytes/s, fetch {} bytes/s",
                args.principal,
                rate_text(quota.produce_bytes_per_s),
                rate_text(quota.fetch_bytes_per_s)
            );
        }
        QuotaCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let quotas = admin
                .describe_quotas(args.principal.as_deref())
                .await
                .map_err(|e| client_error("cannot list the quotas", e))?;
            println!("PRINCIPAL  PRODUCE_BYTES_PER_S  FETCH_BYTES_PER_S");
            for (p, q) in quotas {
                println!(
                    "{p}  {}  {}",
                    rate_text(q.produce_bytes_per_s),
                    rate_text(q.fetch_bytes_per_s)
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_print_as_a_table() {
        let rules = vec![
            AclRule {
                principal: "alice".into(),
                operation: AclOperation::Read,
                resource: AclResource::Topic("orders".into()),
            },
            AclRule {
                principal: "*".into(),
                operation: AclOperation::Describe,
                resource: AclResource::Cluster,
            },
        ];
        assert_eq!(
            format_rules(&rules),
            "PRINCIPAL  OPERATION  RESOURCE\nalice      read       topic orders\n*          describe   cluster\n"
        );
        assert!(parse_operation("Write").is_ok());
        assert!(
            parse_operation("admin")
                .unwrap_err()
                .contains("read, write")
        );
    }
}
