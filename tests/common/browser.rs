//! A headless Chromium driven over the DevTools protocol, for the tests of the pages the
//! binary serves (the chat page, the viz page). The browser is `$MINFER_CHROMIUM` or `chromium`
//! on the PATH (`scripts/install-chromium.sh` installs it).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A headless Chromium and a DevTools connection to its page.
pub struct Browser {
    child: Child,
    socket: tungstenite::WebSocket<TcpStream>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn launch() -> Browser {
        let exe = std::env::var("MINFER_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1000,720",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {exe} ({e}): run scripts/install-chromium.sh"));
        // Chromium says where its DevTools endpoint listens on stderr.
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let ws = loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "Chromium exited before listening"
            );
            if let Some(url) = line.trim().strip_prefix("DevTools listening on ") {
                break url.to_string();
            }
        };
        // Keep draining stderr so that Chromium never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        let port: u16 = ws
            .split(':')
            .nth(2)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let targets: Value = serde_json::from_str(&http_get(port, "/json/list")).unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page target");
        let url = page["webSocketDebuggerUrl"].as_str().unwrap();
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let (socket, _) = tungstenite::client(url, stream).unwrap();
        Browser {
            child,
            socket,
            next_id: 1,
            _profile: profile,
        }
    }

    /// Calls a DevTools method and returns its result (events in between are skipped).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(tungstenite::Message::text(message)).unwrap();
        loop {
            let reply = self.socket.read().unwrap();
            let Ok(text) = reply.to_text() else { continue };
            let reply: Value = serde_json::from_str(text).unwrap();
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it is true.
    pub fn wait_for(&mut self, expression: &str, what: &str) {
        let start = Instant::now();
        while self.eval(expression) != Value::Bool(true) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Opens `url` and waits for the document to load and `ready` (a JavaScript condition).
    pub fn open(&mut self, url: &str, ready: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_for(
            &format!("document.readyState === 'complete' && ({ready})"),
            "the page to load",
        );
    }

    /// A PNG of the page as it is drawn now.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        base64_decode(shot["data"].as_str().unwrap())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback: the body (read to its `Content-Length`: Chromium keeps
/// the connection open).
pub fn http_get(port: u16, path: &str) -> String {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        &s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(s);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// Standard base64 (the screenshot), without a dependency for it.
pub fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .map(value)
        .collect();
    digits
        .chunks(4)
        .flat_map(|q| {
            let n = q
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &d)| n | (d as u32) << (18 - 6 * i));
            let bytes = n.to_be_bytes();
            bytes[1..q.len()].to_vec()
        })
        .collect()
}
