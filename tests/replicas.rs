//! `minfer serve` as one replica of several behind a real load balancer: three replicas of the
//! tiny model on loopback and NGINX in front (run as the current user from a temporary prefix),
//! with the consistent-hash configuration `deploy/nginx.conf` documents. It checks that hashing
//! on `X-Session-Id` keeps each conversation on the replica whose slot holds its prefix (the
//! follow-up turns' cached-token share, against the same traffic under round-robin), that the
//! load still spreads over all three, and that a replica stopped with SIGTERM mid-load closes
//! its listener, finishes what it holds and costs no client an error. Separately, `/ready`
//! through loading, ready, full and draining, `--queue-max`'s 503 and the session-id echo.
//!
//! NGINX is `$MINFER_NGINX`, else `nginx` on the PATH, else `/usr/sbin/nginx`
//! (`scripts/install-nginx.sh` installs Debian's package; `scripts/test.sh` runs it).

mod common;

use common::server::Server;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tiny() -> PathBuf {
    common::tiny_model("qwen2", "Q8_0")
}

/// The two load tests measure rates and spreads: on two cores they must not share them.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn nginx_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MINFER_NGINX") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file());
    on_path
        .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!("no nginx on the PATH or at /usr/sbin/nginx: run scripts/install-nginx.sh (scripts/test.sh does), or set MINFER_NGINX")
        })
}

/// A port nobody listens on now (bound and released; NGINX takes it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// deploy/nginx.conf's two lines that matter, checked to be there by the last test.
const AFFINITY: &str = "hash $minfer_affinity consistent;";
const RETRY: &str = "proxy_next_upstream error timeout http_503 non_idempotent;";

#[derive(Clone, Copy, PartialEq)]
enum Balance {
    /// `hash $http_x_session_id consistent;`: a conversation stays on one replica.
    Affinity,
    /// NGINX's default: each request to the next replica.
    RoundRobin,
}

/// NGINX in the foreground, as the current user, everything it writes under a temporary
/// directory.
struct Nginx {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Nginx {
    fn start(upstreams: &[&str], balance: Balance) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let hash = match balance {
            Balance::Affinity => AFFINITY,
            Balance::RoundRobin => "",
        };
        let servers: String = upstreams
            .iter()
            .map(|u| format!("        server {u} max_fails=1 fail_timeout=10s;\n"))
            .collect();
        for _attempt in 0..5 {
            let port = free_port();
            // The proxy settings are deploy/nginx.conf's; only the paths and ports differ.
            let conf = format!(
                r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format upstream '$http_x_session_id $upstream_addr $upstream_status $status';
    access_log {d}/access.log upstream;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    map $http_x_session_id $minfer_affinity {{
        ""      $request_id;
        default $http_x_session_id;
    }}
    upstream minfer {{
        {hash}
{servers}    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://minfer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # The client's Host (127.0.0.1:PORT): a replica on loopback without a key answers
            # only its own names, and NGINX would send the upstream's name, "minfer".
            proxy_set_header Host $host;
            proxy_buffering off;
            proxy_read_timeout 300s;
            {RETRY}
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"#
            );
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, conf).unwrap();
            let mut child = Command::new(nginx_binary())
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start nginx ({e}): run scripts/install-nginx.sh"));
            let addr = format!("127.0.0.1:{port}");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if TcpStream::connect(&addr).is_ok() {
                    return Nginx { child, addr, dir };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Another process took the port between our probe and NGINX's bind: again.
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "nginx did not start:\n{}",
            std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
        );
    }

    /// Requests NGINX sent to more than one replica: `$upstream_addr` lists every one it tried.
    fn retried(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains(", ")).count()
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: status, headers (names lower-cased), body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A counter of a replica's `/metrics`, matched by its full line prefix (name and labels).
fn metric(addr: &str, series: &str) -> f64 {
    let (_, _, text) = http(addr, "GET", "/metrics", &[], "");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

const CHATS_SERVED: &str = "minfer_requests_total{route=\"/v1/chat/completions\",status=\"200\"}";

fn replicas() -> Vec<Server> {
    // One thread each: three replicas share the two cores.
    let args = [
        "--n-slots",
        "32",
        // The whole cache: 1,024 cells a slot, as before -c was the cache's.
        "--n-ctx",
        "32768",
        "-t",
        "1",
        "--shutdown-timeout",
        "60",
    ];
    (0..3).map(|_| Server::start(&tiny(), &args, &[])).collect()
}

/// The first user message of conversation `id` of a run: its own words from the first token
/// on, so that two conversations share only the template's system prompt.
fn opening(run: &str, id: usize) -> String {
    let words = [
        "river", "stone", "lamp", "cloud", "garden", "window", "violin", "harbor", "pencil", "meadow",
    ];
    let mut text = format!("{run} conversation {id}:");
    let mut x = id as u64 * 2654435761 + 17;
    for _ in 0..60 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push(' ');
        text.push_str(words[(x >> 33) as usize % words.len()]);
    }
    text
}

/// What a load run saw.
#[derive(Default)]
struct Outcome {
    /// Prompt tokens of the follow-up turns, and how many of them were found cached.
    follow_up_prompt: usize,
    follow_up_cached: usize,
    /// Requests answered other than 200, with what they said.
    errors: Vec<String>,
    completed: usize,
}

impl Outcome {
    fn hit_rate(&self) -> f64 {
        self.follow_up_cached as f64 / self.follow_up_prompt.max(1) as f64
    }
}

/// `clients` conversations of `turns` turns each, all at once through `addr`: each turn sends
/// the whole conversation so far (its messages grow), with the conversation's id as
/// `X-Session-Id`. `done` counts finished requests, for a caller watching from outside.
fn converse(addr: &str, run: &str, clients: usize, turns: usize, done: Arc<AtomicUsize>) -> Outcome {
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let threads: Vec<_> = (0..clients)
        .map(|id| {
            let (addr, run, outcome, done) = (
                addr.to_string(),
                run.to_string(),
                Arc::clone(&outcome),
                Arc::clone(&done),
            );
            std::thread::spawn(move || {
                let session = format!("{run}-{id}");
                let mut messages = vec![json!({"role": "user", "content": opening(&run, id)})];
                for turn in 0..turns {
                    let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0});
                    let (status, headers, text) = http(
                        &addr,
                        "POST",
                        "/v1/chat/completions",
                        &[("X-Session-Id", &session)],
                        &body.to_string(),
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                    if status != 200 {
                        let error = format!("{session} turn {turn}: {status} {text}");
                        outcome.lock().unwrap().errors.push(error);
                        return;
                    }
                    assert_eq!(header(&headers, "x-session-id"), Some(session.as_str()), "{headers:?}");
                    let reply: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                    let usage = &reply["usage"];
                    let mut o = outcome.lock().unwrap();
                    if turn > 0 {
                        o.follow_up_prompt += usage["prompt_tokens"].as_u64().unwrap() as usize;
                        o.follow_up_cached +=
                            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
                    }
                    o.completed += 1;
                    drop(o);
                    let content = reply["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    messages.push(json!({"role": "assistant", "content": content}));
                    messages
                        .push(json!({"role": "user", "content": format!("Turn {turn} of {session}: tell me more.")}));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client panicked");
    }
    Arc::try_unwrap(outcome).ok().unwrap().into_inner().unwrap()
}

/// Chat requests each replica answered since `before`.
fn served(replicas: &[Server], before: &[f64]) -> Vec<usize> {
    replicas
        .iter()
        .zip(before)
        .map(|(r, b)| (metric(&r.addr, CHATS_SERVED) - b) as usize)
        .collect()
}

const CLIENTS: usize = 64;
const TURNS: usize = 3;

#[test]
fn hashing_the_session_id_keeps_conversations_on_their_cache_and_still_spreads_the_load() {
    let _heavy = heavy();
    let started = Instant::now();
    let mut measured = Vec::new();
    for balance in [Balance::RoundRobin, Balance::Affinity] {
        let replicas = replicas();
        let addrs: Vec<&str> = replicas.iter().map(|r| r.addr.as_str()).collect();
        let nginx = Nginx::start(&addrs, balance);
        let before: Vec<f64> = replicas.iter().map(|r| metric(&r.addr, CHATS_SERVED)).collect();
        let run = if balance == Balance::Affinity {
            "affinity"
        } else {
            "round-robin"
        };
        let t = Instant::now();
        let outcome = converse(&nginx.addr, run, CLIENTS, TURNS, Arc::new(AtomicUsize::new(0)));
        let per_replica = served(&replicas, &before);
        assert!(outcome.errors.is_empty(), "{:?}\n{}", outcome.errors, nginx.error_log());
        assert_eq!(outcome.completed, CLIENTS * TURNS);
        assert_eq!(per_replica.iter().sum::<usize>(), CLIENTS * TURNS, "{per_replica:?}");
        eprintln!(
            "{run}: {CLIENTS} conversations × {TURNS} turns in {:.1} s; follow-up turns: {} of {} prompt tokens cached ({:.1} %); requests per replica {per_replica:?}",
            t.elapsed().as_secs_f64(),
            outcome.follow_up_cached,
            outcome.follow_up_prompt,
            100.0 * outcome.hit_rate()
        );
        measured.push((outcome.hit_rate(), per_replica));
    }
    let (round_robin, _) = &measured[0];
    let (affinity, spread) = &measured[1];
    // Round-robin shares the system prompt any replica's slots read (the prompt cache is
    // shared by every slot), so it is the misses that tell: a conversation kept on its
    // replica misses at most half as many prompt tokens.
    assert!(
        *affinity >= 0.8 && (1.0 - affinity) * 2.0 <= 1.0 - round_robin,
        "affinity {affinity:.3} against round-robin {round_robin:.3}"
    );
    let total: usize = spread.iter().sum();
    assert!(
        spread.iter().all(|&n| n > 0 && n * 10 <= total * 7),
        "the hash left the load uneven: {spread:?}"
    );
    eprintln!("both runs in {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_replica_stopped_mid_load_finishes_its_requests_and_no_client_sees_an_error() {
    let _heavy = heavy();
    let started = Instant::now();
    let mut replicas = replicas();
    let addrs: Vec<&str> = replicas.iter().map(|r| r.addr.as_str()).collect();
    let nginx = Nginx::start(&addrs, Balance::Affinity);
    let done = Arc::new(AtomicUsize::new(0));
    let load = {
        let (addr, done) = (nginx.addr.clone(), Arc::clone(&done));
        std::thread::spawn(move || converse(&addr, "failover", CLIENTS, TURNS, done))
    };
    // Mid-load: a third of the requests answered, and the victim holding, besides its share of
    // the load, a stream that runs for seconds (4 choices of 1,000 tokens, one after another
    // on its slot), sent to it directly: a request certainly in flight at the signal.
    let victim = 0;
    let held = {
        let addr = replicas[victim].addr.clone();
        std::thread::spawn(move || {
            let body = r#"{"prompt": "a", "n": 4, "max_tokens": 1000, "ignore_eos": true, "stream": true}"#;
            http(&addr, "POST", "/v1/completions", &[], body)
        })
    };
    let wait = Instant::now();
    while done.load(Ordering::Relaxed) < CLIENTS * TURNS / 3
        || metric(&replicas[victim].addr, "minfer_slots_busy ") < 1.0
    {
        assert!(
            wait.elapsed() < Duration::from_secs(60) && !load.is_finished(),
            "the load ended first"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let busy = metric(&replicas[victim].addr, "minfer_slots_busy ");
    let answered_before = metric(&replicas[victim].addr, CHATS_SERVED);
    let status = replicas[victim].terminate(Duration::from_secs(60));
    let outcome = load.join().expect("the load panicked");
    let (held_status, _, held_body) = held.join().unwrap();
    // The log is read from the pipe by a thread: it may trail the exit by a moment.
    wait_for("the last log line", &replicas[victim], || {
        replicas[victim].log().contains("minfer serve: stopped")
    });
    let log = replicas[victim].log();
    assert!(status.success(), "{status:?}\n{log}");
    // An error event is an object with an `error` key; a generated token may well be the word.
    let error_events = held_body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|event| event.get("error").is_some())
        .count();
    assert!(
        held_status == 200 && held_body.contains("data: [DONE]") && error_events == 0,
        "the stream in flight at SIGTERM was cut: {held_status} {held_body}"
    );
    assert!(
        TcpStream::connect(&replicas[victim].addr).is_err(),
        "still accepting after SIGTERM"
    );
    // Requests the victim finished after the signal: its generation lines after the shutdown line.
    let (_, after) = log.split_once("shutting down").expect("the shutdown line");
    let finished_after = after
        .lines()
        .filter(|l| l.starts_with("slot ") && l.contains(" generated "))
        .count();
    assert!(
        outcome.errors.is_empty(),
        "clients saw errors: {:?}\n{}",
        outcome.errors,
        nginx.error_log()
    );
    assert_eq!(outcome.completed, CLIENTS * TURNS);
    assert!(
        finished_after >= 1,
        "the victim held {busy} busy slots at SIGTERM but finished nothing after it:\n{log}"
    );
    let retried_during_load = nginx.retried();
    // Now it is gone: one more turn of each conversation it served goes elsewhere. The first
    // one NGINX sends it finds the port closed and is retried (unless a turn during the load
    // already did, and NGINX has marked the replica down).
    let access = std::fs::read_to_string(nginx.dir.path().join("access.log")).unwrap();
    let victim_addr = replicas[victim].addr.clone();
    let mut sessions: Vec<&str> = access
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(victim_addr.as_str()))
        .filter_map(|l| l.split(' ').next())
        .filter(|s| s.starts_with("failover-"))
        .collect();
    sessions.sort_unstable();
    sessions.dedup();
    assert!(!sessions.is_empty(), "the victim served no conversation:\n{access}");
    for session in &sessions {
        let body = r#"{"messages": [{"role": "user", "content": "one more"}], "max_tokens": 2}"#;
        let (status, headers, text) = http(
            &nginx.addr,
            "POST",
            "/v1/chat/completions",
            &[("X-Session-Id", session)],
            body,
        );
        assert_eq!(status, 200, "{session}: {text}\n{}", nginx.error_log());
        assert_eq!(header(&headers, "x-session-id"), Some(*session));
    }
    let retried = nginx.retried();
    assert!(
        retried >= 1,
        "no request was retried on another replica:\n{}",
        nginx.error_log()
    );
    eprintln!(
        "failover: replica {victim} stopped with {busy} slots busy after answering {answered_before} requests; it finished {finished_after} after SIGTERM and exited 0; NGINX retried {retried_during_load} requests of the load on another replica; {} requests, 0 errors; {} conversations it had served went on elsewhere ({retried} retried in all), in {:.1} s",
        outcome.completed,
        sessions.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Reads a replica's `/ready`: status and the body's `status` field.
fn ready(addr: &str) -> (u16, String) {
    let (status, _, body) = http(addr, "GET", "/ready", &[], "");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, v["status"].as_str().unwrap_or_default().to_string())
}

fn wait_for(what: &str, server: &Server, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} never came:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A request left running on its own connection (dropped: the client hangs up).
fn hold(addr: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

#[test]
fn ready_answers_loading_then_ready_then_full_then_draining_while_health_stays_live() {
    let mut server = Server::start_until(
        &tiny(),
        &[
            "--n-slots",
            "1",
            "--queue-max",
            "1",
            "--n-ctx",
            "2048",
            "--drain-delay",
            "1.5",
        ],
        &[("MINFER_SERVE_LOAD_DELAY", "1.5")],
        "bound to http://",
    );
    let addr = server.addr.clone();
    // Loading: alive, not ready, and work is refused with a hint to come back.
    assert_eq!(ready(&addr), (503, "loading".into()));
    assert_eq!(http(&addr, "GET", "/health", &[], "").0, 200);
    let (status, headers, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "a", "max_tokens": 1}"#,
    );
    assert_eq!((status, header(&headers, "retry-after")), (503, Some("1")), "{body}");
    wait_for("ready", &server, || ready(&addr) == (200, "ready".into()));

    // The session id: a request's header comes back; without one, its `user`.
    let chat = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": "alice"}"#;
    let (_, headers, _) = http(&addr, "POST", "/v1/chat/completions", &[("X-Session-Id", "s-42")], chat);
    assert_eq!(header(&headers, "x-session-id"), Some("s-42"));
    let (_, headers, _) = http(&addr, "POST", "/v1/chat/completions", &[], chat);
    assert_eq!(header(&headers, "x-session-id"), Some("alice"));

    // Full: one long job on the one slot, one waiting; a third is refused. The tiny model makes
    // thousands of tokens a second: a job of 16 choices of 2,000 tokens, run one after another
    // on the one slot, holds it for seconds.
    let long = r#"{"prompt": "a", "n": 16, "max_tokens": 2000, "ignore_eos": true, "temperature": 1, "stream": true}"#;
    let first = hold(&addr, long);
    wait_for("a busy slot", &server, || server.metric("minfer_slots_busy") >= 1.0);
    assert_eq!(ready(&addr), (200, "ready".into()), "one more may still wait");
    let second = hold(&addr, long);
    wait_for("a queued request", &server, || {
        server.metric("minfer_queue_depth") >= 1.0
    });
    assert_eq!(ready(&addr), (503, "full".into()));
    let (status, headers, body) = http(&addr, "POST", "/v1/completions", &[], long);
    assert_eq!((status, header(&headers, "retry-after")), (503, Some("1")), "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["type"], "unavailable_error", "{body}");
    assert_eq!(server.metric("minfer_requests_rejected_total"), 1.0);
    drop((first, second));
    wait_for("room again", &server, || ready(&addr) == (200, "ready".into()));

    // Draining: not ready at once, still alive and accepting for --drain-delay, then closed.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    wait_for("draining", &server, || ready(&addr) == (503, "draining".into()));
    assert_eq!(http(&addr, "GET", "/health", &[], "").0, 200);
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(TcpStream::connect(&addr).is_err(), "still accepting after the drain");
}

#[test]
fn the_dockerfile_builds_from_files_in_the_repository_and_runs_as_the_readme_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("Dockerfile")).expect("a Dockerfile at the root");
    // Continuation lines joined, comments dropped: one instruction per line.
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let instructions: Vec<(String, String)> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (op, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            (op.to_ascii_uppercase(), rest.trim().to_string())
        })
        .collect();
    let stages = instructions.iter().filter(|(op, _)| op == "FROM").count();
    assert!(stages >= 2, "not a multi-stage build: {stages} FROM lines");
    let last_from = instructions.iter().rposition(|(op, _)| op == "FROM").unwrap();
    let final_stage = &instructions[last_from..];
    // Every COPY from the build context names something that exists; COPY --from copies
    // between stages.
    for (op, args) in &instructions {
        if op != "COPY" && op != "ADD" {
            continue;
        }
        let words: Vec<&str> = args.split_whitespace().collect();
        if words.iter().any(|w| w.starts_with("--from=")) {
            continue;
        }
        let paths: Vec<&str> = words.iter().copied().filter(|w| !w.starts_with("--")).collect();
        assert!(paths.len() >= 2, "{op} {args}");
        for source in &paths[..paths.len() - 1] {
            assert!(
                root.join(source).exists(),
                "{op} {args}: {source} is not in the repository"
            );
        }
    }
    let user = final_stage
        .iter()
        .rev()
        .find(|(op, _)| op == "USER")
        .map(|(_, u)| u.clone())
        .expect("the final stage sets a USER");
    assert!(
        !matches!(user.split(':').next(), Some("root" | "0")),
        "the image runs as root: USER {user}"
    );
    // ENTRYPOINT ["minfer", "serve"] and CMD ["/models/model.gguf", ...], as exec forms.
    let exec = |op: &str| -> Vec<String> {
        let args = &final_stage
            .iter()
            .rev()
            .find(|(o, _)| o == op)
            .unwrap_or_else(|| panic!("no {op}"))
            .1;
        serde_json::from_str(args).unwrap_or_else(|e| panic!("{op} {args} is not an exec-form array: {e}"))
    };
    let command = [exec("ENTRYPOINT"), exec("CMD")].concat().join(" ");
    assert!(
        command.contains("--host 0.0.0.0"),
        "{command}: unreachable from outside the container"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let at_scale = readme
        .split_once("## Serving at scale")
        .expect("a Serving at scale section")
        .1;
    assert!(
        at_scale.contains(&format!("# the image runs: {command}")),
        "the README does not show the image's command `{command}`"
    );
    assert!(root.join("deploy/kubernetes.yaml").exists());
}

#[test]
fn the_documented_nginx_config_is_valid_and_carries_the_tested_settings() {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    for line in [AFFINITY, RETRY] {
        assert!(text.contains(line), "deploy/nginx.conf lacks `{line}`");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(nginx_binary())
        .arg("-t")
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nginx -t: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
