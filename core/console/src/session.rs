//! Who is using the console, and what they may see and do.
//!
//! With user authentication off (a broker run with `--auth none`) the console
//! acts with its broker's rights for whoever reaches it ([`Who::Operator`]),
//! which is why it then listens on loopback only unless told otherwise.
//!
//! With it on (`--auth mtls`), every API request carries a bearer token from
//! `rill token issue --principal NAME` (see `rill_net::token`): in an
//! `Authorization: Bearer` header (scripts), or in the cookie
//! [`COOKIE`] that `POST /api/session` sets after checking a pasted token (the
//! browser: HttpOnly, SameSite=Strict, so neither page scripts nor other sites
//! use it). The request is then [`Who::User`], and every read and change is
//! first checked against the cluster's ACLs by the broker's own rules
//! (CheckAccess, as the transform runners check a deployer's rights): what
//! the user may not describe is left out of lists, and anything else refused
//! is a 403 that names the principal, the operation and the resource.
//!
//! Invariant: apart from the assets and `/api/session`, no API request runs
//! before [`who`] named its principal and the handler's checks passed.

use std::time::SystemTime;

use hyper::{HeaderMap, StatusCode, header};
use rill_client::{AclOperation, AclResource};
use rill_net::token::TokenVerifier;

use crate::State;
use crate::http::ApiError;

/// The cookie that holds a signed-in browser's token.
pub(crate) const COOKIE: &str = "rill_console";
/// Checks per CheckAccess request when filtering a long list.
const CHECKS_PER_REQUEST: usize = 5_000;

/// Who a request is made by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    /// User authentication is off: the broker's own rights.
    Operator,
    /// A signed-in principal (its name; `User:NAME` in ACLs), until its
    /// token expires (`exp`, seconds since the epoch).
    User { name: String, exp: u64 },
}

impl Who {
    /// The principal in ACL terms, if authentication is on.
    pub(crate) fn stamp(&self) -> Option<String> {
        match self {
            Who::Operator => None,
            Who::User { name, .. } => Some(format!("User:{name}")),
        }
    }

    /// Whether the token it signed in with has expired by now.
    pub(crate) fn expired(&self) -> bool {
        match self {
            Who::Operator => false,
            Who::User { exp, .. } => {
                let now = SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                now >= *exp
            }
        }
    }
}

/// The token a request carries: the `Authorization: Bearer` header, else the
/// [`COOKIE`].
pub(crate) fn token_of(headers: &HeaderMap) -> Option<String> {
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let (scheme, token) = auth.trim().split_once(' ').unwrap_or((auth, ""));
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(token.trim().to_string());
        }
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Who made a request (401 when authentication is on and it carries no valid
/// token).
pub(crate) fn who(verifier: Option<&TokenVerifier>, headers: &HeaderMap) -> Result<Who, ApiError> {
    let Some(verifier) = verifier else {
        return Ok(Who::Operator);
    };
    let Some(token) = token_of(headers).filter(|t| !t.is_empty()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "sign in: this console needs a token from `rill token issue --principal NAME` \
             (the brokers run with --auth mtls)",
        ));
    };
    verifier
        .verify_claims(&token, SystemTime::now())
        .map(|c| Who::User {
            name: c.sub,
            exp: c.exp,
        })
        .map_err(|e| ApiError::new(StatusCode::UNAUTHORIZED, format!("sign in again: {e}")))
}

/// Refuses (403, naming every refusal) unless `who` may do all of `checks`.
pub(crate) async fn require(
    state: &State,
    who: &Who,
    checks: Vec<(AclOperation, AclResource)>,
) -> Result<(), ApiError> {
    let denied: Vec<String> = allowed_each(state, who, checks)
        .await?
        .into_iter()
        .flatten()
        .collect();
    if denied.is_empty() {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, denied.join("; ")))
    }
}

/// Per check, `None` when `who` may do it, else why not.
pub(crate) async fn allowed_each(
    state: &State,
    who: &Who,
    checks: Vec<(AclOperation, AclResource)>,
) -> Result<Vec<Option<String>>, ApiError> {
    let Some(stamp) = who.stamp() else {
        return Ok(vec![None; checks.len()]);
    };
    let admin = state
        .client()
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("cannot connect to the broker: {e}"),
            )
        })?
        .admin();
    let mut out = Vec::with_capacity(checks.len());
    for chunk in checks.chunks(CHECKS_PER_REQUEST) {
        let answers = admin
            .check_each(&stamp, chunk.to_vec())
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("cannot check {stamp}'s rights with the broker: {e}"),
                )
            })?;
        out.extend(answers);
    }
    Ok(out)
}

/// Keeps the items `who` may describe (`resource` names each one's resource).
pub(crate) async fn visible<T>(
    state: &State,
    who: &Who,
    items: Vec<T>,
    resource: impl Fn(&T) -> AclResource,
) -> Result<Vec<T>, ApiError> {
    if *who == Who::Operator {
        return Ok(items);
    }
    let checks = items
        .iter()
        .map(|i| (AclOperation::Describe, resource(i)))
        .collect();
    let allowed = allowed_each(state, who, checks).await?;
    Ok(items
        .into_iter()
        .zip(allowed)
        .filter_map(|(i, denied)| denied.is_none().then_some(i))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_token_comes_from_the_header_or_the_cookie() {
        assert_eq!(
            token_of(&headers(&[("authorization", "Bearer abc.def.ghi")])),
            Some("abc.def.ghi".into())
        );
        assert_eq!(
            token_of(&headers(&[("cookie", "a=1; rill_console=tok; b=2")])),
            Some("tok".into())
        );
        assert_eq!(token_of(&headers(&[("authorization", "Basic eA==")])), None);
        assert_eq!(token_of(&headers(&[("cookie", "other=1")])), None);
    }

    #[test]
    fn without_a_verifier_everyone_is_the_operator_and_with_one_a_token_is_needed() {
        assert_eq!(who(None, &HeaderMap::new()).unwrap(), Who::Operator);
        let home = std::env::temp_dir().join(format!("rill-console-who-{}", std::process::id()));
        rill_net::ensure_dev_ca(&home).unwrap();
        let verifier =
            TokenVerifier::from_ca_file(&home.join(rill_net::dev_ca::DEV_CA_CERT_FILE)).unwrap();
        let e = who(Some(&verifier), &HeaderMap::new()).unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert!(e.message.contains("rill token issue"), "{}", e.message);
        let e = who(
            Some(&verifier),
            &headers(&[("cookie", "rill_console=junk")]),
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert!(e.message.contains("malformed"), "{}", e.message);
        let token = rill_net::token::issue(
            &home.join(rill_net::dev_ca::DEV_CA_KEY_FILE),
            "alice",
            std::time::Duration::from_secs(60),
            SystemTime::now(),
        )
        .unwrap();
        let bearer = format!("Bearer {token}");
        let w = who(Some(&verifier), &headers(&[("authorization", &bearer)])).unwrap();
        assert_eq!(w.stamp(), Some("User:alice".into()));
        assert!(!w.expired());
        assert!(
            Who::User {
                name: "alice".into(),
                exp: 1
            }
            .expired()
        );
        let _ = std::fs::remove_dir_all(&home);
    }
}
