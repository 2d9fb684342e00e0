//! The chat page at `/`, in a real headless browser (Debian's Chromium, driven over the
//! DevTools protocol): load it, type a message, watch the reply stream in, reload and find the
//! conversation kept; `--no-webui` turns the page off.
//!
//! The browser is `$MINFER_CHROMIUM` or `chromium` on the PATH (`scripts/install-chromium.sh`
//! installs it; the test script runs that first). `MINFER_WEBUI_MODEL` serves another model and
//! `MINFER_WEBUI_SCREENSHOT=FILE` saves a PNG of the page with its reply (the README's picture).

mod common;

use common::server::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A headless Chromium and a DevTools connection to its page.
struct Browser {
    child: Child,
    socket: tungstenite::WebSocket<TcpStream>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch() -> Browser {
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
    fn call(&mut self, method: &str, params: Value) -> Value {
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
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it is true.
    fn wait_for(&mut self, expression: &str, what: &str) {
        let start = Instant::now();
        while self.eval(expression) != Value::Bool(true) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_for(
            "document.readyState === 'complete' && !!document.getElementById('messages')",
            "the page to load",
        );
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
fn http_get(port: u16, path: &str) -> String {
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

/// The messages on the page: (class, text) each.
const MESSAGES: &str =
    "JSON.stringify([...document.querySelectorAll('#messages .msg')].map(e => [e.className, e.textContent]))";

#[test]
fn the_chat_page_streams_a_typed_message_s_reply_and_keeps_the_conversation_over_a_reload() {
    let model = std::env::var("MINFER_WEBUI_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| common::tiny_model("qwen2", "Q8_0"));
    let server = Server::start(&model, &["--n-slots", "1"], &[]);
    let mut browser = Browser::launch();
    browser.open(&server.url("/"));
    assert_eq!(browser.eval("document.title"), "minfer");
    // Settings first: short, greedy replies.
    browser.eval(
        "(() => { for (const [id, v] of [['max_tokens', '48'], ['temperature', '0'], ['system', 'Be brief.']]) { \
           const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('change')); } })()",
    );
    // Type the message and press Enter, as a person would.
    browser.eval("document.getElementById('input').focus()");
    browser.call("Input.insertText", json!({"text": "Write a haiku about the sea."}));
    for kind in ["keyDown", "keyUp"] {
        browser.call(
            "Input.dispatchKeyEvent",
            json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}),
        );
    }
    browser.wait_for(
        "document.getElementById('messages').dataset.state === 'idle' && \
         document.querySelectorAll('#messages .msg').length === 2",
        "the reply to finish",
    );
    let messages: Vec<(String, String)> = serde_json::from_str(browser.eval(MESSAGES).as_str().unwrap()).unwrap();
    assert_eq!(
        messages[0],
        ("msg user".to_string(), "Write a haiku about the sea.".to_string())
    );
    assert_eq!(messages[1].0, "msg assistant", "{messages:?}");
    assert!(!messages[1].1.is_empty(), "an empty reply");
    // It arrived as a stream: the reply was drawn once per content delta, more than once.
    let chunks: u64 = browser
        .eval("document.querySelector('#messages .msg.assistant').dataset.chunks")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(chunks >= 2, "the reply came in {chunks} piece(s)");
    // The server saw the page's settings: the reply is the API's greedy reply to the same turn.
    let (status, api) = server.json(
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a haiku about the sea."}],
               "max_tokens": 48, "temperature": 0, "top_p": 0.95, "top_k": 40}),
    );
    assert_eq!(status, 200);
    let rendered = browser.eval("document.querySelector('#messages .msg.assistant').innerText");
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        words(rendered.as_str().unwrap()),
        words(api["choices"][0]["message"]["content"].as_str().unwrap())
            .replace("**", "")
            .replace('`', ""),
        "the page shows the API's reply"
    );
    if let Ok(path) = std::env::var("MINFER_WEBUI_SCREENSHOT") {
        let shot = browser.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(shot["data"].as_str().unwrap());
        std::fs::write(path, png).unwrap();
    }
    // A reload keeps the conversation (the browser's storage).
    browser.call("Page.reload", json!({}));
    browser.wait_for(
        "document.readyState === 'complete' && document.querySelectorAll('#messages .msg').length === 2",
        "the conversation after the reload",
    );
    let kept: Vec<(String, String)> = serde_json::from_str(browser.eval(MESSAGES).as_str().unwrap()).unwrap();
    assert_eq!(kept, messages);
    assert_eq!(browser.eval("document.getElementById('max_tokens').value"), "48");
    // New chat empties it.
    browser.eval("document.getElementById('new-chat').click()");
    assert_eq!(browser.eval("document.querySelectorAll('#messages .msg').length"), 0);
}

#[test]
fn no_webui_turns_the_page_off_and_the_page_needs_no_api_key() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let off = Server::start(&model, &["--n-slots", "1", "--no-webui"], &[]);
    let (status, _) = off.request("GET", "/", "", b"");
    assert_eq!(status, 404);
    let keyed = Server::start(&model, &["--n-slots", "1", "--api-key", "k"], &[]);
    let (status, page) = keyed.request("GET", "/", "", b"");
    assert_eq!(status, 200);
    assert!(page.contains("<title>minfer</title>"));
    // Everything the page calls still needs the key.
    let (status, _) = keyed.request("GET", "/v1/models", "", b"");
    assert_eq!(status, 401);
}

/// Standard base64 (the screenshot), without a dependency for it.
fn base64_decode(s: &str) -> Vec<u8> {
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
