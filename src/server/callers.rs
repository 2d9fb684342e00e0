//! Who may call a server without an API key, and bodies refused by their declared size.
//!
//! Without a key, anything that can reach the port can call the server, and a browser is a
//! reach-anything proxy: a page on any site may send a "simple" cross-origin POST (a
//! `text/plain` body needs no preflight) to `http://127.0.0.1:8080/completion`, and a site whose
//! name a rebinding DNS server points at 127.0.0.1 is same-origin with the server in the
//! browser's eyes. So, without a key:
//! - a request whose `Origin` is neither the server's own nor one `--cors-origin` allows is
//!   refused (403) on every method that can change anything: only GET, HEAD and OPTIONS pass;
//! - on a loopback bind, a `Host` that is not one of the server's own names (`localhost`,
//!   127.0.0.0/8, `[::1]`, or an `--allowed-host`) is refused (403), which is what defeats DNS
//!   rebinding. `/health` and `/ready` answer any `Host`: probes use whatever name they like.
//!
//! With a key, a browser cannot send the `Authorization` header cross-origin without a
//! preflight that CORS answers, so neither check is needed. Separately, for every server, a
//! `Content-Length` above `--max-body-bytes` is a 413 at once, before any of the body is read.
//!
//! This file decides admission only; it must not read bodies or know the API's shapes.

use super::error::ApiError;
use super::routes::App;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Who may call: what [`admit`] checks.
#[derive(Debug, Clone, Default)]
pub struct Callers {
    /// Whether the server listens on loopback only, so that `Host` must be one of its names.
    pub loopback: bool,
    /// Further names `Host` may carry (`--allowed-host`, `*` for any).
    pub allowed_hosts: Vec<String>,
}

/// Whether `host` (a bind address) is loopback only: `localhost`, 127.0.0.0/8 or `::1`.
pub fn is_loopback_bind(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The name part of a `Host` header value or an origin's authority: without the port, and
/// without the brackets of an IPv6 literal.
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(name, _)| name)
}

impl Callers {
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host);
        is_loopback_bind(name)
            || self
                .allowed_hosts
                .iter()
                .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
    }
}

/// Whether `--cors-origin` (`origins`, `*` for any) lets a page from `origin` call the server.
pub fn cors_allows(origins: &[String], origin: &str) -> bool {
    origins.iter().any(|a| a == "*" || a == origin)
}

/// The admission checks, as a middleware.
pub async fn admit(State(app): State<App>, req: Request, next: Next) -> Response {
    match check(
        &app.callers,
        app.api_key.is_some(),
        &app.cors_origins,
        app.max_body_bytes,
        &req,
    ) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The admission checks of one request: a declared body within `max_body_bytes`; and, on a
/// server without an API key, a `Host` that is one of its names when it listens on loopback
/// (DNS rebinding), and no cross-origin POST from an origin not allowed.
pub fn check(
    callers: &Callers,
    has_key: bool,
    cors_origins: &[String],
    max_body_bytes: usize,
    req: &Request,
) -> Result<(), ApiError> {
    if let Some(declared) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        if declared > max_body_bytes as u64 {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body of {declared} bytes (Content-Length) is larger than the limit of {max_body_bytes} bytes"
                ),
            ));
        }
    }
    if has_key {
        return Ok(());
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let probe = matches!(req.uri().path(), "/health" | "/ready");
    if let Some(host) = &host {
        if callers.loopback && !probe && !callers.host_allowed(host) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Host '{}' is not a name of this server, which listens on loopback without an API key \
                     (--allowed-host NAME admits another name, as behind a proxy)",
                    host.chars().take(200).collect::<String>()
                ),
            ));
        }
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("(not text)");
            let own = host.as_deref().is_some_and(|host| {
                origin
                    .split_once("://")
                    .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
            });
            if !own && !cors_allows(cors_origins, origin) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "a cross-origin request from '{}' is refused: the server has no API key \
                         (--cors-origin ORIGIN lets a page from ORIGIN call it)",
                        origin.chars().take(200).collect::<String>()
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_binds_and_host_names_are_recognised() {
        for bind in ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"] {
            assert!(is_loopback_bind(bind), "{bind}");
        }
        for bind in ["0.0.0.0", "::", "10.0.0.1", "example.com"] {
            assert!(!is_loopback_bind(bind), "{bind}");
        }
        assert_eq!(host_name("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("localhost"), "localhost");
        let callers = Callers {
            loopback: true,
            allowed_hosts: vec!["minfer.internal".into()],
        };
        assert!(callers.host_allowed("localhost:8080"));
        assert!(callers.host_allowed("MINFER.internal:80"));
        assert!(!callers.host_allowed("attacker.example:8080"));
        assert!(!callers.host_allowed("localhost.attacker.example"));
    }
}
