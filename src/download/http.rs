//! The HTTP client the downloads share: redirects followed, proxies taken from the environment
//! (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`), a time limit on connecting and on
//! every read, and transport failures turned into [`DownloadError`]s naming the URL.
//!
//! It knows nothing of registries or the cache.

use super::DownloadError;
use std::io::Read;
use std::time::Duration;

/// The largest listing or manifest read into memory: far above any real one, and a bound on
/// what a hostile server can make us allocate.
pub(super) const MAX_JSON_BYTES: u64 = 32 << 20;

pub(super) struct Client {
    agent: ureq::Agent,
    timeout: Duration,
}

/// A response with its status, headers and a body still to read.
pub(super) struct Response {
    pub url: String,
    pub inner: ureq::http::Response<ureq::Body>,
    timeout: Duration,
}

impl Client {
    pub fn new(timeout: Duration) -> Client {
        let config = ureq::Agent::config_builder()
            // Statuses are ours to explain (a 401 means "set HF_TOKEN").
            .http_status_as_error(false)
            // The token goes to the host it was meant for, never to a redirect's blob store.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            // Bytes are hashed as they arrive: a transparently decompressed body would not be
            // the bytes the digest was published for.
            .accept_encoding("identity")
            .user_agent(concat!("minfer/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: config.into(),
            timeout,
        }
    }

    /// GET `url` with extra headers; any status comes back as a response.
    pub fn get(&self, url: &str, headers: &[(&str, String)]) -> Result<Response, DownloadError> {
        let mut request = self.agent.get(url);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let inner = request.call().map_err(|e| self.error(url, e, false))?;
        Ok(Response {
            url: url.to_string(),
            inner,
            timeout: self.timeout,
        })
    }

    fn error(&self, url: &str, e: ureq::Error, partial: bool) -> DownloadError {
        transport_error(url, e, self.timeout, partial)
    }
}

fn transport_error(url: &str, e: ureq::Error, timeout: Duration, partial: bool) -> DownloadError {
    match e {
        ureq::Error::Timeout(_) => DownloadError::Timeout {
            url: url.to_string(),
            seconds: timeout.as_secs_f64(),
            partial,
        },
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => DownloadError::Timeout {
            url: url.to_string(),
            seconds: timeout.as_secs_f64(),
            partial,
        },
        other => DownloadError::Transport {
            url: url.to_string(),
            reason: other.to_string(),
        },
    }
}

/// Whether a read error is the time limit running out.
pub(super) fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
}

impl Response {
    pub fn status(&self) -> u16 {
        self.inner.status().as_u16()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.inner.headers().get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON, at most [`MAX_JSON_BYTES`] of it.
    pub fn json(mut self) -> Result<serde_json::Value, DownloadError> {
        let bytes = self
            .inner
            .body_mut()
            .with_config()
            .limit(MAX_JSON_BYTES)
            .read_to_vec()
            .map_err(|e| transport_error(&self.url, e, self.timeout, false))?;
        serde_json::from_slice(&bytes).map_err(|e| DownloadError::BadResponse {
            url: self.url.clone(),
            reason: format!("not JSON: {e}"),
        })
    }

    /// The start of an error body, for the message: servers often say why.
    pub fn detail(mut self) -> String {
        let mut buf = Vec::new();
        let _ = self.inner.body_mut().as_reader().take(2048).read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
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

    pub fn into_reader(self) -> impl Read {
        self.inner.into_body().into_reader()
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
    }
}
