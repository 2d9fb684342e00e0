//! A `minfer serve` child process for the integration tests, and raw-HTTP helpers to talk to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    /// host:port
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Runs the project's Python `script` (a path from the repository's root, run with its
    /// virtualenv) with `args`, echoes its output, and fails the test with it and the server's
    /// log if the script fails.
    pub fn run_python(&self, script: &str, args: &[&str]) {
        let out = Command::new(super::python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
            .args(args)
            .output()
            .expect("python runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{stdout}");
        assert!(
            out.status.success(),
            "{script} {args:?} failed:\n{stdout}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Starts `minfer serve` on a free port and returns once it is ready (its "listening on"
    /// line, printed after the model has loaded).
    pub fn start(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_until(model, args, env, "listening on http://")
    }

    /// Starts `minfer serve --models-dir DIR` (several models, loaded on demand).
    #[allow(dead_code)]
    pub fn start_models(dir: &Path, args: &[&str]) -> Server {
        // `serve --models-dir=DIR ...`: the flag stands where the model would.
        let flag = format!("--models-dir={}", dir.display());
        Self::start_until(Path::new(&flag), args, &[], "listening on http://")
    }

    /// Starts `minfer serve` and returns as soon as a log line holds `marker` followed by the
    /// address: "bound to http://" returns while the model is still loading.
    pub fn start_until(model: &Path, args: &[&str], env: &[(&str, &str)], marker: &str) -> Server {
        let marker = marker.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("serve")
            .arg(model)
            .args(["--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .env_remove("MINFER_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("minfer serve starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split(marker.as_str()).nth(1) {
                    let addr = addr.split(|c: char| c == ';' || c.is_whitespace()).next().unwrap_or("");
                    let _ = tx.send(addr.to_string());
                }
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("the server did not start:\n{}", log.lock().unwrap()));
        Server { child, addr, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// A raw HTTP/1.1 request; see [`raw_request`].
    pub fn raw(&self, request: &[u8]) -> (u16, String) {
        raw_request(&self.addr, request)
    }

    pub fn request(&self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, String) {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
            self.addr,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.raw(&req)
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.request("POST", path, "Content-Type: application/json\r\n", body.as_bytes())
    }

    pub fn json(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self.post(path, &body.to_string());
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, value)
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.request("GET", "/metrics", "", b"");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} missing from {text}"))
    }

    /// A `/proc/PID/status` figure of the server, in kB (`VmRSS`, `VmHWM`).
    pub fn memory_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < timeout,
                "no exit within {timeout:?} of SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_until_closed(s: &mut TcpStream, timeout: Duration) -> String {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut reply = Vec::new();
    match s.read_to_end(&mut reply) {
        Ok(_) => {}
        // A reset is a close too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "still open after {timeout:?} ({e}); read {:?}",
            String::from_utf8_lossy(&reply)
        ),
    }
    String::from_utf8_lossy(&reply).into_owned()
}

/// A raw HTTP/1.1 request; the status and body (chunked bodies are de-chunked by reading
/// the whole reply and leaving the framing in place, which the callers do not mind).
pub fn raw_request(addr: &str, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request).unwrap();
    let mut reply = Vec::new();
    if let Err(e) = s.read_to_end(&mut reply) {
        panic!(
            "no reply within the timeout ({e}) to {:?}",
            String::from_utf8_lossy(&request[..request.len().min(200)])
        );
    }
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}
