//! How `rill` talks to the user on stderr: logging setup and the one-line error.
//!
//! Error format: `error: <what failed>: <why>. <what to do>` — the anyhow chain is
//! flattened into one line, outermost context first; a cause whose text the line
//! already contains (thiserror messages often embed their source) is skipped, and
//! newlines are folded so the error is always exactly one line.

use std::io::IsTerminal;
use std::time::Duration;

use tracing_subscriber::EnvFilter;

/// How long the runtime may wait for blocking-pool threads after a command is done
/// (every command awaits its own work first; what is left is e.g. a stdin read
/// that will never complete after Ctrl-C).
pub const RUNTIME_SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// Sets up `tracing` to stderr. `--log-level` wins over RUST_LOG, which wins over
/// the command's default.
pub fn init_logging(flag: Option<&str>, default_level: &str) {
    let filter = match flag {
        Some(level) => EnvFilter::try_new(level).unwrap_or_else(|e| {
            eprintln!("warning: invalid --log-level {level:?} ({e}); using {default_level}");
            EnvFilter::new(default_level)
        }),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// Renders an error chain as one line (without the `error: ` prefix).
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Prints the error as one line on stderr.
pub fn print_error(err: &anyhow::Error) {
    eprintln!("error: {}", one_line(err));
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("disk\nfull")
        }
    }
    impl std::error::Error for Inner {}

    #[test]
    fn chain_is_flattened_to_one_line_without_repeats() {
        let err = Err::<(), _>(Inner)
            .context("cannot write segment: disk full")
            .context("cannot produce to topic t")
            .unwrap_err();
        assert_eq!(
            one_line(&err),
            "cannot produce to topic t: cannot write segment: disk full"
        );
        let err = Err::<(), _>(Inner).context("cannot append").unwrap_err();
        assert_eq!(one_line(&err), "cannot append: disk full");
    }
}
