//! The HTTP client the downloads share: redirects followed here (not by ureq), the
//! `Authorization` header kept only while a redirect stays on the original request's origin
//! (scheme, host and port); proxies taken from the environment (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`); a time limit on connecting and on every read, a deadline on a whole
//! request with its body, and a minimum rate a body must keep over each window of the read
//! limit; transport failures turned into [`DownloadError`]s naming the URL.
//!
//! It knows nothing of registries or the cache.

use super::{Config, DownloadError};
use std::io::Read;
use std::time::{Duration, Instant};

/// The largest listing or manifest read into memory: far above any real one, and a bound on
/// what a hostile server can make us allocate.
pub(super) const MAX_JSON_BYTES: u64 = 32 << 20;

/// Redirects followed before giving up: Hugging Face and the registries answer with one or two.
const MAX_REDIRECTS: usize = 10;

/// How long and how slowly a request may run.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// For connecting and for any one read; also the window the rate is measured over.
    timeout: Duration,
    /// For a whole request, its body and its redirects included.
    deadline: Duration,
    /// Bytes per second a body must average over each window; 0 turns the check off.
    min_rate: u64,
}

pub(super) struct Client {
    agent: ureq::Agent,
    limits: Limits,
}

/// A response with its status, headers and a body still to read.
pub(super) struct Response {
    /// The URL asked for (before any redirect): the one errors name.
    pub url: String,
    pub inner: ureq::http::Response<ureq::Body>,
    limits: Limits,
    /// When the request, body included, must be done.
    by: Instant,
}

impl Client {
    pub fn new(config: &Config) -> Client {
        let timeout = config.timeout;
        let agent_config = ureq::Agent::config_builder()
            // Statuses are ours to explain (a 401 means "set HF_TOKEN").
            .http_status_as_error(false)
            // Redirects are followed by `get`, which alone decides where the token goes: ureq's
            // same-host rule compares host names, so another port of the host would get it.
            .max_redirects(0)
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            // Bytes are hashed as they arrive: a transparently decompressed body would not be
            // the bytes the digest was published for.
            .accept_encoding("identity")
            .user_agent(concat!("minfer/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: agent_config.into(),
            limits: Limits {
                timeout,
                deadline: config.deadline,
                min_rate: config.min_rate,
            },
        }
    }

    /// When a request that starts now must be done: the downloads of one file share this
    /// deadline through [`Client::get_by`].
    pub fn deadline_from_now(&self) -> Instant {
        // A deadline too far to represent is as good as none: a century stands in for it.
        let now = Instant::now();
        now.checked_add(self.limits.deadline)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
    }

    /// GET `url` with extra headers, following redirects, under a deadline of its own; any
    /// other status comes back as a response.
    pub fn get(&self, url: &str, headers: &[(&str, String)]) -> Result<Response, DownloadError> {
        self.get_by(url, headers, self.deadline_from_now())
    }

    /// [`Client::get`] with the deadline `by`, which the response's body shares. An
    /// `Authorization` header goes only to URLs of `url`'s origin: a redirect elsewhere (a blob
    /// store, another port of the same host) is sent without it.
    pub fn get_by(&self, url: &str, headers: &[(&str, String)], by: Instant) -> Result<Response, DownloadError> {
        let first = origin(url);
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let same_origin = first.is_some() && origin(&current) == first;
            let remaining = by.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.deadline_error(url, false));
            }
            let mut request = self.agent.get(&current);
            for (name, value) in headers {
                if !same_origin && name.eq_ignore_ascii_case("authorization") {
                    continue;
                }
                request = request.header(*name, value);
            }
            let inner = request
                .config()
                .timeout_global(Some(remaining))
                .build()
                .call()
                .map_err(|e| self.error(url, e, by))?;
            let status = inner.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok(Response {
                    url: url.to_string(),
                    inner,
                    limits: self.limits,
                    by,
                });
            }
            let bad = |reason: String| DownloadError::BadResponse {
                url: current.clone(),
                reason,
            };
            let location = inner
                .headers()
                .get("location")
                .ok_or_else(|| bad(format!("HTTP {status} without a Location")))?
                .to_str()
                .map_err(|_| bad(format!("HTTP {status} with a Location that is not text")))?;
            current = resolve(&current, location).ok_or_else(|| {
                bad(format!(
                    "a redirect to {location:?}, which is not an http:// or https:// URL"
                ))
            })?;
        }
        Err(DownloadError::BadResponse {
            url: url.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    fn error(&self, url: &str, e: ureq::Error, by: Instant) -> DownloadError {
        if matches!(e, ureq::Error::Timeout(ureq::Timeout::Global)) || Instant::now() >= by {
            return self.deadline_error(url, false);
        }
        transport_error(url, e, self.limits.timeout)
    }

    fn deadline_error(&self, url: &str, partial: bool) -> DownloadError {
        DownloadError::Deadline {
            url: url.to_string(),
            seconds: self.limits.deadline.as_secs_f64(),
            partial,
        }
    }
}

fn transport_error(url: &str, e: ureq::Error, timeout: Duration) -> DownloadError {
    match e {
        ureq::Error::Timeout(_) => DownloadError::Timeout {
            url: url.to_string(),
            seconds: timeout.as_secs_f64(),
            partial: false,
        },
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => DownloadError::Timeout {
            url: url.to_string(),
            seconds: timeout.as_secs_f64(),
            partial: false,
        },
        other => DownloadError::Transport {
            url: url.to_string(),
            reason: other.to_string(),
        },
    }
}

/// A URL's origin as the token's scope: lower-cased scheme and host, and the port (80 and
/// 443 when the URL names none). `None` for anything but http and https.
fn origin(url: &str) -> Option<(String, String, u16)> {
    let uri: ureq::http::Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let host = uri.host()?.to_ascii_lowercase();
    Some((scheme, host, uri.port_u16().unwrap_or(default_port)))
}

/// A redirect's `Location` made absolute against the URL that answered it (RFC 3986's
/// reference forms: a full URL, `//host/path`, `/path`, `?query`, a relative path); `None` for
/// a scheme other than http and https. Dot segments are left for the server to resolve.
fn resolve(base: &str, location: &str) -> Option<String> {
    // A fragment is never sent.
    let location = location.trim().split('#').next().unwrap_or("");
    let base = base.split('#').next().unwrap_or(base);
    let scheme_end = location.find(':');
    let has_scheme = scheme_end.is_some_and(|i| {
        let scheme = &location[..i];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    });
    if has_scheme {
        let scheme = location[..scheme_end.unwrap_or(0)].to_ascii_lowercase();
        return matches!(scheme.as_str(), "http" | "https").then(|| location.to_string());
    }
    let (base_scheme, rest) = base.split_once("://")?;
    if let Some(authority_path) = location.strip_prefix("//") {
        return Some(format!("{base_scheme}://{authority_path}"));
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let origin = &base[..base_scheme.len() + 3 + authority_end];
    let path_and_query = &rest[authority_end..];
    let path = path_and_query.split('?').next().unwrap_or("");
    Some(if location.starts_with('/') {
        format!("{origin}{location}")
    } else if location.is_empty() {
        base.to_string()
    } else if location.starts_with('?') {
        format!("{origin}{path}{location}")
    } else {
        let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
        format!("{origin}{dir}{location}")
    })
}

/// Whether a read error is the time limit running out.
fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut || timeout_of(e).is_some()
}

/// Which of ureq's time limits a read error is, if it is one.
fn timeout_of(e: &std::io::Error) -> Option<ureq::Timeout> {
    match e.get_ref()?.downcast_ref::<ureq::Error>()? {
        ureq::Error::Timeout(which) => Some(*which),
        _ => None,
    }
}

/// Why a body could not be read on.
pub(super) enum BodyError {
    /// A limit ran out (a read's time, the deadline, the minimum rate); the error is complete.
    Limit(DownloadError),
    /// The connection failed otherwise.
    Io(std::io::Error),
}

/// A response body read under the request's limits: its deadline, and the minimum rate over
/// each window of the read timeout (a server trickling a byte now and then never lets a read
/// time out, so only the rate catches it).
pub(super) struct Body {
    reader: ureq::BodyReader<'static>,
    url: String,
    limits: Limits,
    by: Instant,
    window_start: Instant,
    window_bytes: u64,
    /// Whether what arrived is kept for a later run (a file's `.part`), and whether anything
    /// is: what a limit's error says about resuming.
    keeps: bool,
    partial: bool,
}

impl Body {
    /// Read the next bytes into `buf`; `Ok(0)` at the end of the body.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, BodyError> {
        // Checked before reading, so the bytes of the last read are the caller's to keep.
        let now = Instant::now();
        if now >= self.by {
            return Err(BodyError::Limit(self.deadline_error()));
        }
        let window = now - self.window_start;
        if self.limits.min_rate > 0 && window >= self.limits.timeout {
            let rate = self.window_bytes as f64 / window.as_secs_f64();
            if rate < self.limits.min_rate as f64 {
                return Err(BodyError::Limit(DownloadError::TooSlow {
                    url: self.url.clone(),
                    rate,
                    window: window.as_secs_f64(),
                    min_rate: self.limits.min_rate,
                    partial: self.partial,
                }));
            }
            self.window_start = now;
            self.window_bytes = 0;
        }
        match self.reader.read(buf) {
            Ok(n) => {
                self.window_bytes += n as u64;
                self.partial |= self.keeps && n > 0;
                Ok(n)
            }
            Err(e) if timeout_of(&e) == Some(ureq::Timeout::Global) || Instant::now() >= self.by => {
                Err(BodyError::Limit(self.deadline_error()))
            }
            Err(e) if is_timeout(&e) => Err(BodyError::Limit(DownloadError::Timeout {
                url: self.url.clone(),
                seconds: self.limits.timeout.as_secs_f64(),
                partial: self.partial,
            })),
            Err(e) => Err(BodyError::Io(e)),
        }
    }

    fn deadline_error(&self) -> DownloadError {
        DownloadError::Deadline {
            url: self.url.clone(),
            seconds: self.limits.deadline.as_secs_f64(),
            partial: self.partial,
        }
    }
}

impl Response {
    pub fn status(&self) -> u16 {
        self.inner.status().as_u16()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.inner.headers().get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON, at most [`MAX_JSON_BYTES`] of it, read under the request's limits.
    pub fn json(self) -> Result<serde_json::Value, DownloadError> {
        let url = self.url.clone();
        let mut body = self.body(Some(MAX_JSON_BYTES), false);
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(BodyError::Limit(e)) => return Err(e),
                Err(BodyError::Io(e)) => {
                    return Err(DownloadError::Transport {
                        url,
                        reason: ureq::Error::from(e).to_string(),
                    })
                }
            }
        }
        serde_json::from_slice(&bytes).map_err(|e| DownloadError::BadResponse {
            url,
            reason: format!("not JSON: {e}"),
        })
    }

    /// The start of an error body, for the message: servers often say why.
    pub fn detail(self) -> String {
        let mut body = self.body(None, false);
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        // What arrives before a limit runs out is all the message gets.
        while got.len() < buf.len() {
            match body.read(&mut buf[..2048 - got.len()]) {
                Ok(n @ 1..) => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&got);
        // Hugging Face and registries answer {"error": "..."} or {"errors": [{"message": ...}]}.
        let from_json = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| {
            v.get("error").and_then(|e| e.as_str().map(str::to_string)).or_else(|| {
                v.pointer("/errors/0/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
        });
        let line = from_json.unwrap_or_else(|| text.lines().next().unwrap_or("").to_string());
        line.chars().take(200).collect()
    }

    /// The status as an error, with what the server said.
    pub fn status_error(self) -> DownloadError {
        let (url, status) = (self.url.clone(), self.status());
        DownloadError::Status {
            url,
            status,
            detail: self.detail(),
        }
    }

    /// The body of a file whose bytes are kept for resuming; `partial` says whether some are
    /// already.
    pub fn into_body(self, partial: bool) -> Body {
        let mut body = self.body(None, true);
        body.partial = partial;
        body
    }

    fn body(self, limit: Option<u64>, keeps: bool) -> Body {
        let with_config = self.inner.into_body().into_with_config();
        let reader = match limit {
            // Past the limit ureq fails the read: a listing that large is refused, not cut.
            Some(limit) => with_config.limit(limit).reader(),
            None => with_config.reader(),
        };
        Body {
            reader,
            url: self.url,
            limits: self.limits,
            by: self.by,
            window_start: Instant::now(),
            window_bytes: 0,
            keeps,
            partial: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_timeout_is_recognised_as_one() {
        let e = std::io::Error::other(ureq::Error::Timeout(ureq::Timeout::RecvBody));
        assert!(is_timeout(&e));
        assert!(!is_timeout(&std::io::Error::other("reset")));
        let global = std::io::Error::other(ureq::Error::Timeout(ureq::Timeout::Global));
        assert_eq!(timeout_of(&global), Some(ureq::Timeout::Global));
    }

    #[test]
    fn an_origin_is_scheme_host_and_port_with_the_default_ports_filled_in() {
        let o = |u: &str| origin(u);
        assert_eq!(o("https://huggingface.co/a"), o("HTTPS://HuggingFace.co:443/b?c"));
        assert_eq!(o("http://127.0.0.1/x"), o("http://127.0.0.1:80"));
        assert_ne!(o("http://127.0.0.1:8000/x"), o("http://127.0.0.1:8001/x"));
        assert_ne!(o("http://h/x"), o("https://h/x"));
        assert_ne!(o("https://h/x"), o("https://h.evil/x"));
        assert_eq!(o("ftp://h/x"), None);
    }

    #[test]
    fn a_location_resolves_against_the_url_that_answered_it() {
        let base = "http://h:8000/a/b/c?q=1#f";
        assert_eq!(resolve(base, "https://x/y").as_deref(), Some("https://x/y"));
        assert_eq!(resolve(base, "HTTP://x/y").as_deref(), Some("HTTP://x/y"));
        assert_eq!(resolve(base, "//x:9/y").as_deref(), Some("http://x:9/y"));
        assert_eq!(
            resolve(base, "/blobs/1?s=2#frag").as_deref(),
            Some("http://h:8000/blobs/1?s=2")
        );
        assert_eq!(resolve(base, "?z").as_deref(), Some("http://h:8000/a/b/c?z"));
        assert_eq!(resolve(base, "d").as_deref(), Some("http://h:8000/a/b/d"));
        assert_eq!(resolve("http://h", "d").as_deref(), Some("http://h/d"));
        assert_eq!(resolve("http://h?x", "d").as_deref(), Some("http://h/d"));
        assert_eq!(
            resolve(base, "d?u=http://e").as_deref(),
            Some("http://h:8000/a/b/d?u=http://e")
        );
        assert_eq!(resolve(base, "file:///etc/passwd"), None);
        assert_eq!(resolve(base, "javascript:x"), None);
    }
}
