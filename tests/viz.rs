//! `minfer viz` in a real headless browser: the page loads, draws one element per node of the
//! graph the server reports, takes a typed prompt, and within seconds shows per-node timings
//! (heat), the generated text and the tokens/s chart. A screenshot is saved as a test artifact
//! (`target/viz-page.png`, or `$MINFER_VIZ_SCREENSHOT`). The page's routes refuse bad input.

mod common;

use common::browser::{http_get, Browser};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `minfer viz` child on a free port.
struct Viz {
    child: Child,
    port: u16,
}

impl Viz {
    fn start(model: &std::path::Path) -> Viz {
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("viz")
            .arg(model)
            .args(["--port", "0", "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).expect("viz listens");
        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
        Viz { child, port }
    }

    fn post(&self, body: &str) -> (u16, String) {
        let request = format!(
            "POST /viz/run HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        common::server::raw_request(&format!("127.0.0.1:{}", self.port), request.as_bytes())
    }
}

impl Drop for Viz {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_viz_page_draws_every_node_and_shows_live_timings_text_and_speed_for_a_typed_prompt() {
    let model = std::env::var("MINFER_VIZ_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| common::tiny_model("qwen2", "Q8_0"));
    let viz = Viz::start(&model);
    let graph: Value = serde_json::from_str(&http_get(viz.port, "/viz/graph")).unwrap();
    assert_eq!(graph["kind"], "decode");
    let n_nodes = graph["nodes"].as_array().unwrap().len();
    let mut browser = Browser::launch();
    browser.open(
        &format!("http://127.0.0.1:{}/", viz.port),
        "document.querySelectorAll('#graph .node').length > 0",
    );
    assert_eq!(browser.eval("document.title"), "minfer viz");
    assert_eq!(
        browser.eval("document.querySelectorAll('#graph .node').length"),
        n_nodes
    );
    // Fused nodes (a SwiGLU on the CPU) are marked, the nodes folded into them drawn as not
    // run, and every node has the backend's colour before any timing.
    let nodes = graph["nodes"].as_array().unwrap();
    let count = |key: &str, value: bool| nodes.iter().filter(|n| n[key] == value).count();
    assert!(count("fused", true) > 0 && count("live", false) > 0, "{graph}");
    assert_eq!(
        browser.eval("document.querySelectorAll('#graph .node.fused').length"),
        count("fused", true)
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#graph .node.dead').length"),
        count("live", false)
    );
    assert_eq!(
        browser.eval("document.querySelector('#graph .node rect').getAttribute('fill')"),
        "#fef9c3"
    );
    // Type a prompt and press Run, as a person would.
    browser.eval("document.getElementById('prompt').focus()");
    browser.call("Input.insertText", json!({"text": "Write a haiku about the sea."}));
    browser.eval("document.getElementById('n_predict').value = '24'");
    browser.eval("document.getElementById('run').click()");
    browser.wait_for(
        "document.body.dataset.done === '1' && document.getElementById('text').textContent.length > 0",
        "the generation to finish on the page",
    );
    // Timings landed on the decode graph's nodes (the page redrew it after the prompt's pass).
    let timed = browser
        .eval("document.querySelectorAll('#graph .node[data-us]').length")
        .as_u64()
        .unwrap();
    assert!(timed as usize >= n_nodes / 2, "{timed} of {n_nodes} nodes show a time");
    assert_eq!(
        browser.eval("document.querySelectorAll('#graph .node').length"),
        n_nodes
    );
    assert!(browser.eval("Number(document.body.dataset.steps)").as_u64().unwrap() >= 2);
    let points = browser.eval("document.querySelector('#chart polyline').getAttribute('points')");
    assert!(
        points.as_str().unwrap().split(' ').count() >= 2,
        "the chart has {points}"
    );
    let heated = browser.eval(
        "[...document.querySelectorAll('#graph .node rect')].filter(r => r.getAttribute('fill').startsWith('rgb(')).length",
    );
    assert!(heated.as_u64().unwrap() > 0);
    let path = std::env::var("MINFER_VIZ_SCREENSHOT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/viz-page.png").to_string());
    std::fs::write(&path, browser.screenshot()).unwrap();
    eprintln!("screenshot: {path}");
}

#[test]
fn the_run_route_refuses_bad_bodies_and_a_second_run_while_one_runs() {
    let viz = Viz::start(&common::tiny_model("qwen2", "Q8_0"));
    let (status, body) = viz.post("not json");
    assert_eq!(status, 400, "{body}");
    let (status, body) = viz.post(r#"{"prompt": ""}"#);
    assert!(status == 400 && body.contains("prompt"), "{body}");
    let (status, body) = viz.post(r#"{"prompt": "hi", "n_predict": 0}"#);
    assert!(status == 400 && body.contains("n_predict"), "{body}");
    let (status, _) = viz.post(r#"{"prompt": "hi", "n_predict": 2000}"#);
    assert_eq!(status, 202);
    let (status, body) = viz.post(r#"{"prompt": "hi", "n_predict": 4}"#);
    assert!(status == 409 && body.contains("running"), "{body}");
}

#[test]
fn connections_that_never_finish_their_headers_are_closed_while_the_page_serves_on() {
    use std::io::Write;
    let viz = Viz::start(&common::tiny_model("qwen2", "Q8_0"));
    let addr = format!("127.0.0.1:{}", viz.port);
    let started = std::time::Instant::now();
    // Half a request line, then nothing; and a connection that never sends at all.
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    assert!(http_get(viz.port, "/health").contains("ok"));
    // The server's header timeout (10 s) closes both.
    for stream in [&mut half, &mut idle] {
        common::server::read_until_closed(stream, Duration::from_secs(20));
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(9), "closed after {waited:?}");
}
