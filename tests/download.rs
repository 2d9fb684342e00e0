//! Models by name, end to end through the binary: `minfer pull` and model references against a
//! local server that imitates the Hugging Face API (tree listing with LFS digests, paginated by
//! `Link`; `resolve` redirecting to a blob route; gated repositories) and the Ollama registry
//! (manifests, blobs), and that injects faults: a connection dropped mid-body, a range ignored,
//! a wrong digest, a stall, a body trickled a byte at a time. The payloads are the tiny fixture models; every test has its own
//! model cache in a temporary directory.

mod common;

use minfer::gguf::split::split_path;
use minfer::gguf::{GgufFile, GgufWriter, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;

/// A file of a fake repository: its path, the bytes served for it and the digest the listing
/// publishes (the bytes' own unless a test lies).
struct RepoFile {
    path: String,
    blob: String,
    size: u64,
    listed_sha: String,
}

#[derive(Default)]
struct Repo {
    /// The token a gated repository wants.
    token: Option<String>,
    files: Vec<RepoFile>,
}

/// Faults for the next blob responses.
#[derive(Default)]
struct Faults {
    /// Close the connection after this many body bytes (once).
    drop_after: Option<u64>,
    /// Send this many body bytes, then nothing (once).
    stall_after: Option<u64>,
    /// Answer every range request with the whole file.
    ignore_range: bool,
    /// Pause after every chunk.
    throttle: Option<Duration>,
    /// Send blob bodies one byte at a time, pausing this long after each.
    trickle: Option<Duration>,
    /// Send listing bodies one byte at a time, pausing this long after each.
    trickle_listing: Option<Duration>,
}

/// One blob request: the range start asked for, and whether it carried a token.
#[derive(Debug, Clone, PartialEq)]
struct BlobRequest {
    range_start: Option<u64>,
    authorized: bool,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    blobs: HashMap<String, Arc<Vec<u8>>>,
    manifests: HashMap<String, String>,
    faults: Faults,
    /// Blob body bytes written to clients.
    served: u64,
    blob_requests: Vec<BlobRequest>,
    /// Where `resolve` redirects (`URL/blobs/SHA`); the server's own port under the host name
    /// `localhost` when unset.
    blob_store: Option<String>,
}

struct Server {
    url: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let (st, base) = (state.clone(), url.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (st, base) = (st.clone(), base.clone());
                std::thread::spawn(move || {
                    let _ = handle(conn, &st, &base);
                });
            }
        });
        Server { url, state }
    }

    fn add_blob(&self, bytes: Vec<u8>) -> (String, u64) {
        let sha = common::sha256_hex(&bytes);
        let size = bytes.len() as u64;
        self.state.lock().unwrap().blobs.insert(sha.clone(), Arc::new(bytes));
        (sha, size)
    }

    /// Put `bytes` in repository `repo` under `path`.
    fn add_file(&self, repo: &str, path: &str, bytes: Vec<u8>) -> String {
        let (sha, size) = self.add_blob(bytes);
        let mut st = self.state.lock().unwrap();
        st.repos.entry(repo.to_string()).or_default().files.push(RepoFile {
            path: path.to_string(),
            blob: sha.clone(),
            size,
            listed_sha: sha.clone(),
        });
        sha
    }

    fn faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.state.lock().unwrap().faults);
    }

    fn served(&self) -> u64 {
        self.state.lock().unwrap().served
    }

    fn blob_requests(&self) -> Vec<BlobRequest> {
        self.state.lock().unwrap().blob_requests.clone()
    }
}

struct Request {
    path: String,
    query: String,
    headers: HashMap<String, String>,
}

fn read_request(conn: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let target = line.split_whitespace().nth(1)?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Some(Request {
        path: path.to_string(),
        query: query.to_string(),
        headers,
    })
}

fn respond(conn: &mut TcpStream, status: u16, extra: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)
}

/// A 200 whose body comes one byte at a time, `pause` after each.
fn respond_trickled(
    conn: &mut TcpStream,
    extra: &[(&str, String)],
    body: &[u8],
    pause: Duration,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    trickle(conn, body, pause)
}

/// Write `bytes` one at a time, `pause` after each; ends when the client hangs up.
fn trickle(conn: &mut TcpStream, bytes: &[u8], pause: Duration) -> std::io::Result<()> {
    for b in bytes {
        conn.write_all(std::slice::from_ref(b))?;
        conn.flush()?;
        std::thread::sleep(pause);
    }
    Ok(())
}

fn handle(mut conn: TcpStream, state: &Mutex<State>, base: &str) -> std::io::Result<()> {
    let Some(req) = read_request(&conn) else { return Ok(()) };
    let auth = req.headers.get("authorization").cloned();
    let parts: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "models", owner, repo, "tree", "main"] => {
            let st = state.lock().unwrap();
            let Some(r) = st.repos.get(&format!("{owner}/{repo}")) else {
                drop(st);
                let code = [("X-Error-Code", "RepoNotFound".to_string())];
                return respond(&mut conn, 404, &code, br#"{"error":"Repository not found"}"#);
            };
            if r.token.is_some() && auth != r.token.as_ref().map(|t| format!("Bearer {t}")) {
                drop(st);
                return respond(
                    &mut conn,
                    401,
                    &[],
                    br#"{"error":"Access to this model is restricted"}"#,
                );
            }
            // Two entries a page, so that every listing of more is paginated.
            let cursor: usize = req
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("cursor="))
                .map_or(0, |c| c.parse().unwrap());
            let mut entries: Vec<serde_json::Value> =
                vec![serde_json::json!({"type": "file", "path": "README.md", "size": 5, "oid": "0"})];
            for f in &r.files {
                entries.push(serde_json::json!({
                    "type": "file", "path": f.path, "size": f.size, "oid": "1",
                    "lfs": {"oid": f.listed_sha, "size": f.size, "pointerSize": 134}
                }));
            }
            let page: Vec<_> = entries.iter().skip(cursor).take(2).cloned().collect();
            let mut extra = Vec::new();
            if cursor + 2 < entries.len() {
                let next = format!("{}?recursive=true&cursor={}", req.path, cursor + 2);
                extra.push(("Link", format!("<{next}>; rel=\"next\"")));
            }
            let trickle = st.faults.trickle_listing;
            drop(st);
            let body = serde_json::to_string(&page).unwrap();
            match trickle {
                Some(pause) => respond_trickled(&mut conn, &extra, body.as_bytes(), pause),
                None => respond(&mut conn, 200, &extra, body.as_bytes()),
            }
        }
        [owner, repo, "resolve", "main", rest @ ..] => {
            let path = rest.join("/");
            let st = state.lock().unwrap();
            let found = st.repos.get(&format!("{owner}/{repo}")).map(|r| {
                let allowed = r.token.is_none() || auth == r.token.as_ref().map(|t| format!("Bearer {t}"));
                (allowed, r.files.iter().find(|f| f.path == path).map(|f| f.blob.clone()))
            });
            let blob_store = st.blob_store.clone();
            drop(st);
            match found {
                Some((false, _)) => respond(&mut conn, 401, &[], b"{}"),
                // To another host name, as Hugging Face redirects to its blob store.
                Some((true, Some(blob))) => {
                    let blob_store = blob_store.unwrap_or_else(|| base.replace("127.0.0.1", "localhost"));
                    respond(
                        &mut conn,
                        302,
                        &[("Location", format!("{blob_store}/blobs/{blob}"))],
                        b"",
                    )
                }
                _ => respond(&mut conn, 404, &[], b"{}"),
            }
        }
        ["v2", "library", name, "manifests", tag] => {
            let manifest = state.lock().unwrap().manifests.get(&format!("{name}:{tag}")).cloned();
            match manifest {
                Some(m) => respond(&mut conn, 200, &[], m.as_bytes()),
                None => respond(
                    &mut conn,
                    404,
                    &[],
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                ),
            }
        }
        ["v2", "library", _, "blobs", digest] => {
            let sha = digest.strip_prefix("sha256:").unwrap_or(digest);
            respond(&mut conn, 307, &[("Location", format!("/blobs/{sha}"))], b"")
        }
        ["blobs", key] => serve_blob(&mut conn, state, key, &req, auth.is_some()),
        _ => respond(&mut conn, 404, &[], b"not found"),
    }
}

fn serve_blob(
    conn: &mut TcpStream,
    state: &Mutex<State>,
    key: &str,
    req: &Request,
    authorized: bool,
) -> std::io::Result<()> {
    let range_start = req
        .headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .map(|s| s.parse::<u64>().unwrap());
    let (data, drop_after, stall_after, throttle, ignore_range, trickled) = {
        let mut st = state.lock().unwrap();
        st.blob_requests.push(BlobRequest {
            range_start,
            authorized,
        });
        let Some(data) = st.blobs.get(key).cloned() else {
            drop(st);
            return respond(conn, 404, &[], b"");
        };
        let f = &mut st.faults;
        (
            data,
            f.drop_after.take(),
            f.stall_after.take(),
            f.throttle,
            f.ignore_range,
            f.trickle,
        )
    };
    let start = match range_start {
        Some(s) if !ignore_range => s,
        _ => 0,
    };
    let size = data.len() as u64;
    if start >= size {
        return respond(conn, 416, &[("Content-Range", format!("bytes */{size}"))], b"");
    }
    let mut head = format!("Content-Length: {}\r\nConnection: close\r\n", size - start);
    let status = if start > 0 {
        head.push_str(&format!("Content-Range: bytes {start}-{}/{size}\r\n", size - 1));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    conn.write_all(format!("HTTP/1.1 {status}\r\n{head}\r\n").as_bytes())?;
    let body = &data[start as usize..];
    let limit = drop_after.or(stall_after).unwrap_or(u64::MAX).min(body.len() as u64) as usize;
    if let Some(pause) = trickled {
        return trickle(conn, &body[..limit], pause);
    }
    for chunk in body[..limit].chunks(CHUNK) {
        conn.write_all(chunk)?;
        state.lock().unwrap().served += chunk.len() as u64;
        if let Some(t) = throttle {
            std::thread::sleep(t);
        }
    }
    conn.flush()?;
    if stall_after.is_some() {
        std::thread::sleep(Duration::from_secs(60));
    }
    // Dropping the connection after `drop_after` bytes is the fault itself.
    Ok(())
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(common::fixtures().join("models").join(name)).unwrap()
}

/// The `test/tiny-GGUF` repository: three quants of the tiny qwen2 model.
fn tiny_repo(server: &Server) {
    for (path, fixture_name) in [
        ("tiny-qwen2-Q4_0.gguf", "tiny-qwen2-Q4_0.gguf"),
        ("tiny-qwen2-Q4_K_M.gguf", "tiny-qwen2-Q4_K.gguf"),
        ("tiny-qwen2-Q8_0.gguf", "tiny-qwen2-Q8_0.gguf"),
    ] {
        server.add_file("test/tiny-GGUF", path, fixture(fixture_name));
    }
}

fn minfer(server: &Server, cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
    c.env("MINFER_MODELS", cache)
        .env("HF_ENDPOINT", &server.url)
        .env("MINFER_OLLAMA_REGISTRY", &server.url)
        .env("HF_HOME", cache.join("no-hf-home"))
        .env("MINFER_HTTP_TIMEOUT", "20")
        .env_remove("HF_TOKEN")
        .env_remove("HF_TOKEN_PATH");
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        c.env_remove(proxy);
    }
    c
}

fn pull(server: &Server, cache: &Path, reference: &str) -> Output {
    minfer(server, cache).args(["pull", reference]).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn pulled_path(out: &Output) -> PathBuf {
    assert!(out.status.success(), "{}", stderr(out));
    PathBuf::from(String::from_utf8(out.stdout.clone()).unwrap().trim())
}

/// The names in the cache directory, hidden ones (locks, temporaries) excluded.
fn cache_names(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cache)
        .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
        .unwrap_or_default();
    names.retain(|n| !n.starts_with('.'));
    names.sort();
    names
}

#[test]
fn a_model_runs_by_its_hf_reference_then_from_the_cache_by_name_and_is_listed() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("models");
    let gen = ["Hello world", "--no-template", "--greedy", "-n", "4", "--ignore-eos"];
    let direct = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(common::fixtures().join("models/tiny-qwen2-Q4_K.gguf"))
        .args(gen)
        .output()
        .unwrap();
    assert!(direct.status.success(), "{}", stderr(&direct));

    // No quant: Q4_K_M, fetched before the run.
    let out = minfer(&server, &cache)
        .arg("hf:test/tiny-GGUF")
        .args(gen)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, direct.stdout, "the same text as from the file itself");
    assert!(stderr(&out).contains("fetched and verified"), "{}", stderr(&out));
    let path = cache.join("tiny-qwen2-Q4_K_M.gguf");
    assert_eq!(std::fs::read(&path).unwrap(), fixture("tiny-qwen2-Q4_K.gguf"));

    // Pulled as it is now: already there, nothing fetched again.
    let served = server.served();
    assert_eq!(pulled_path(&pull(&server, &cache, "hf:test/tiny-GGUF:q4_k_m")), path);
    assert_eq!(server.served(), served);

    // With the server gone, the reference and the plain name still resolve from the cache.
    let gone = Server {
        url: "http://127.0.0.1:1".into(),
        state: Default::default(),
    };
    for model in [
        "hf:test/tiny-GGUF",
        "hf:test/tiny-GGUF:Q4_K_M",
        "tiny-qwen2-Q4_K_M.gguf",
        "tiny-qwen2-Q4_K_M",
    ] {
        let out = minfer(&gone, &cache).arg(model).args(gen).output().unwrap();
        assert!(out.status.success(), "{model}: {}", stderr(&out));
        assert_eq!(out.stdout, direct.stdout, "{model}");
    }
    let out = minfer(&gone, &cache)
        .args(["info", "tiny-qwen2-Q4_K_M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let out = minfer(&gone, &cache).arg("list").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list = String::from_utf8(out.stdout).unwrap();
    let row = list
        .lines()
        .find(|l| l.starts_with("tiny-qwen2-Q4_K_M.gguf"))
        .expect(&list);
    let cells: Vec<&str> = row.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        cells,
        [
            "tiny-qwen2-Q4_K_M.gguf",
            "1.9 MiB",
            "Q4_K - Medium",
            "hf:test/tiny-GGUF:Q4_K_M"
        ],
        "{list}"
    );

    let out = minfer(&gone, &cache).args(["no-such-model", "hi"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("model no-such-model: no such file, and no model of that name in the cache"),
        "{}",
        stderr(&out)
    );
    let out = minfer(&gone, &cache)
        .args(["info", "models/absent.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("model models/absent.gguf: no such file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_interrupted_download_resumes_from_the_byte_it_had() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    let size = fixture("tiny-qwen2-Q8_0.gguf").len() as u64;
    server.faults(|f| f.drop_after = Some(700_000));
    let out = pull(&server, dir.path(), "hf:test/tiny-GGUF:Q8_0");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("run again to resume"), "{}", stderr(&out));
    let part = dir.path().join("tiny-qwen2-Q8_0.gguf.part");
    let held = std::fs::metadata(&part).unwrap().len();
    assert!(held > 0 && held <= 700_000, "{held}");
    assert!(
        !dir.path().join("tiny-qwen2-Q8_0.gguf").exists(),
        "no file under the final name"
    );

    let path = pulled_path(&pull(&server, dir.path(), "hf:test/tiny-GGUF:Q8_0"));
    assert_eq!(std::fs::read(&path).unwrap(), fixture("tiny-qwen2-Q8_0.gguf"));
    let requests = server.blob_requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(
        requests[1].range_start,
        Some(held),
        "the second run asks for what it lacks"
    );
    // Bytes sent twice: only what was in flight when the connection dropped.
    let overlap = server.served() - size;
    assert_eq!(overlap, 700_000 - held);
    assert!(overlap < 256 << 10, "{overlap}");
    assert_eq!(
        cache_names(dir.path()),
        ["tiny-qwen2-Q8_0.gguf", "tiny-qwen2-Q8_0.gguf.json"]
    );
}

#[test]
fn a_server_that_ignores_the_range_makes_the_download_start_over() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    let size = fixture("tiny-qwen2-Q4_0.gguf").len() as u64;
    server.faults(|f| f.drop_after = Some(500_000));
    assert!(!pull(&server, dir.path(), "hf:test/tiny-GGUF:Q4_0").status.success());
    server.faults(|f| f.ignore_range = true);
    let path = pulled_path(&pull(&server, dir.path(), "hf:test/tiny-GGUF:Q4_0"));
    assert_eq!(std::fs::read(path).unwrap(), fixture("tiny-qwen2-Q4_0.gguf"));
    assert_eq!(server.served(), 500_000 + size);
}

#[test]
fn a_wrong_digest_is_refused_and_nothing_enters_the_cache() {
    let server = Server::start();
    server.add_file("test/bad-GGUF", "bad-Q8_0.gguf", fixture("tiny-qwen3-Q8_0.gguf"));
    server
        .state
        .lock()
        .unwrap()
        .repos
        .get_mut("test/bad-GGUF")
        .unwrap()
        .files[0]
        .listed_sha = "ab".repeat(32);
    let dir = tempfile::tempdir().unwrap();
    let out = pull(&server, dir.path(), "hf:test/bad-GGUF");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("bad-Q8_0.gguf: sha256 mismatch: expected {}", "ab".repeat(32))),
        "{err}"
    );
    assert_eq!(
        cache_names(dir.path()),
        Vec::<String>::new(),
        "no file, no part, no sidecar"
    );
}

#[test]
fn a_missing_repository_is_a_clear_error() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let out = pull(&server, dir.path(), "hf:nobody/nothing-GGUF:Q4_0");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("hf:nobody/nothing-GGUF: no such repository at {}", server.url)),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_gated_repository_needs_hf_token_which_stays_off_the_blob_store() {
    let server = Server::start();
    gated_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    let out = pull(&server, dir.path(), "hf:test/gated-GGUF");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("access refused (HTTP 401)") && stderr(&out).contains("set HF_TOKEN"),
        "{}",
        stderr(&out)
    );
    let out = minfer(&server, dir.path())
        .env("HF_TOKEN", "hf_wrong")
        .args(["pull", "hf:test/gated-GGUF"])
        .output()
        .unwrap();
    assert!(stderr(&out).contains("does not grant access"), "{}", stderr(&out));
    let out = minfer(&server, dir.path())
        .env("HF_TOKEN", "hf_secret")
        .args(["pull", "hf:test/gated-GGUF"])
        .output()
        .unwrap();
    assert_eq!(
        std::fs::read(pulled_path(&out)).unwrap(),
        fixture("tiny-qwen3-Q4_0.gguf")
    );
    assert_eq!(
        server.blob_requests(),
        [BlobRequest {
            range_start: None,
            authorized: false
        }],
        "the redirect to the blob store drops the token"
    );
}

#[test]
fn a_quant_the_repository_lacks_is_refused_listing_the_quants_it_has() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    let out = pull(&server, dir.path(), "hf:test/tiny-GGUF:Q5_K_M");
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("hf:test/tiny-GGUF: no GGUF file for Q5_K_M; the quants available are: Q4_0, Q4_K_M, Q8_0"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_stalled_server_times_out_quickly_keeping_what_arrived() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    server.faults(|f| f.stall_after = Some(300_000));
    let started = Instant::now();
    let out = minfer(&server, dir.path())
        .env("MINFER_HTTP_TIMEOUT", "1")
        .args(["pull", "hf:test/tiny-GGUF:Q8_0"])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let err = stderr(&out);
    assert!(
        err.contains("no answer for 1 s") && err.contains("run again to resume"),
        "{err}"
    );
    assert_eq!(cache_names(dir.path()), ["tiny-qwen2-Q8_0.gguf.part"]);

    let out = minfer(&server, dir.path())
        .env("MINFER_HTTP_TIMEOUT", "soon")
        .args(["pull", "hf:test/tiny-GGUF:Q8_0"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("MINFER_HTTP_TIMEOUT=\"soon\": expected a number of seconds"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn two_concurrent_pulls_fetch_the_file_once_and_both_get_it() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    // About a second and a half per download, so that the second process starts during it.
    server.faults(|f| f.throttle = Some(Duration::from_millis(50)));
    let spawn = || {
        minfer(&server, dir.path())
            .args(["pull", "hf:test/tiny-GGUF:Q4_0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn();
    std::thread::sleep(Duration::from_millis(300));
    let second = spawn();
    let (a, b) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    assert_eq!(pulled_path(&a), pulled_path(&b));
    assert_eq!(std::fs::read(pulled_path(&a)).unwrap(), fixture("tiny-qwen2-Q4_0.gguf"));
    assert_eq!(server.blob_requests().len(), 1, "one download");
    assert_eq!(server.served(), fixture("tiny-qwen2-Q4_0.gguf").len() as u64);
    // Whichever took the lock first, the other waited for it.
    let waited = |o: &Output| stderr(o).contains("another process is fetching it; waiting");
    assert!(waited(&a) != waited(&b), "{}\n{}", stderr(&a), stderr(&b));
}

/// The tiny qwen2 model written as three parts, llama.cpp's gguf-split way: metadata in the
/// first, the tensors spread over all three.
fn split_tiny_model() -> Vec<Vec<u8>> {
    let src = GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap();
    let tensors = src.tensors();
    let per_part = tensors.len().div_ceil(3);
    (0..3)
        .map(|i| {
            let mut w = GgufWriter::new();
            if i == 0 {
                w.set_all(src.metadata());
            }
            w.set("split.no", Value::U16(i as u16))
                .set("split.count", Value::U16(3))
                .set("split.tensors.count", Value::I32(tensors.len() as i32));
            for t in tensors.iter().skip(i * per_part).take(per_part) {
                w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
                    .unwrap();
            }
            w.to_bytes().unwrap()
        })
        .collect()
}

#[test]
fn a_split_model_is_fetched_whole_and_opens_as_one_model() {
    let server = Server::start();
    let parts = split_tiny_model();
    for (i, bytes) in parts.iter().enumerate() {
        server.add_file(
            "test/split-GGUF",
            &split_path("Q8_0/tiny-split-Q8_0", i as u32, 3),
            bytes.clone(),
        );
    }
    server.add_file(
        "test/split-GGUF",
        "tiny-split-Q4_0.gguf",
        fixture("tiny-qwen2-Q4_0.gguf"),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = pulled_path(&pull(&server, dir.path(), "hf:test/split-GGUF:Q8_0"));
    assert_eq!(path, dir.path().join("tiny-split-Q8_0-00001-of-00003.gguf"));
    let file = GgufFile::open(&path).unwrap();
    let original = GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap();
    assert_eq!(file.paths().count(), 3);
    assert_eq!(file.tensors().len(), original.tensors().len());
    for t in original.tensors() {
        assert_eq!(
            file.tensor_data(file.tensor(&t.name).unwrap()),
            original.tensor_data(t),
            "{}",
            t.name
        );
    }
    let out = minfer(&server, dir.path()).arg("list").output().unwrap();
    let list = String::from_utf8(out.stdout).unwrap();
    assert!(list.contains("tiny-split-Q8_0-00001-of-00003.gguf"), "{list}");
    assert!(!list.contains("00002-of"), "the parts are one entry: {list}");
}

#[test]
fn an_ollama_model_is_fetched_by_name_and_tag_and_verified() {
    let server = Server::start();
    let (sha, size) = server.add_blob(fixture("tiny-qwen3-Q4_0.gguf"));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": format!("sha256:{}", "d".repeat(64)), "size": 9},
            {"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{sha}"), "size": size},
        ]
    });
    server
        .state
        .lock()
        .unwrap()
        .manifests
        .insert("tiny:q4".into(), manifest.to_string());
    let dir = tempfile::tempdir().unwrap();
    let path = pulled_path(&pull(&server, dir.path(), "ollama:tiny:q4"));
    assert_eq!(path, dir.path().join("ollama-tiny-q4.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), fixture("tiny-qwen3-Q4_0.gguf"));
    let out = minfer(&server, dir.path()).arg("list").output().unwrap();
    let list = String::from_utf8(out.stdout).unwrap();
    assert!(
        list.lines()
            .any(|l| l.starts_with("ollama-tiny-q4.gguf") && l.ends_with("ollama:tiny:q4")),
        "{list}"
    );

    // Ollama's habit: the bare NAME:TAG is the same model, `minfer run` runs it (one answer
    // with a prompt, a conversation without one), from the cache now.
    let out = minfer(&server, dir.path())
        .args(["run", "tiny:q4", "Hello", "-n", "3", "--greedy"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut chat = minfer(&server, dir.path())
        .args(["run", "tiny:q4", "-n", "3", "--greedy"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut chat.stdin.take().unwrap(), b"Hello\nAgain\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Two lines in, two turns answered.
    assert_eq!(
        stderr(&out).matches("Prefill:").count(),
        2,
        "a conversation: {}",
        stderr(&out)
    );

    let out = pull(&server, dir.path(), "ollama:tiny");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("ollama:tiny:latest: no such model at {}", server.url)),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_server_of_several_models_pulls_one_as_ollama_does_and_serves_it_by_that_name() {
    let server = Server::start();
    let (sha, size) = server.add_blob(fixture("tiny-qwen2-Q8_0.gguf"));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{sha}"), "size": size}],
    });
    server
        .state
        .lock()
        .unwrap()
        .manifests
        .insert("tiny:q8".into(), manifest.to_string());
    let dir = tempfile::tempdir().unwrap();
    let flag = format!("--models-dir={}", dir.path().display());
    let registry = server.url.clone();
    let serve = common::server::Server::start_until(
        Path::new(&flag),
        &["--n-slots", "1", "-c", "256"],
        &[
            ("MINFER_OLLAMA_REGISTRY", registry.as_str()),
            ("MINFER_HTTP_TIMEOUT", "20"),
        ],
        "listening on http://",
    );
    let (status, lines) = serve.post("/api/pull", r#"{"model": "tiny:q8"}"#);
    assert_eq!(status, 200, "{lines}");
    // NDJSON lines (the raw body is chunked: its size lines are no objects).
    let lines: Vec<serde_json::Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(serde_json::Value::is_object)
        .collect();
    assert_eq!(lines[0]["status"], "pulling manifest");
    assert!(
        lines.iter().any(|l| l["completed"] == size && l["total"] == size),
        "{lines:?}"
    );
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    // The model is the directory's now, by the name it was pulled as and by its file's.
    let chat = |model: &str| {
        serve.post(
            "/api/chat",
            &serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": false,
                                "options": {"num_predict": 2}})
            .to_string(),
        )
    };
    let (status, answer) = chat("tiny:q8");
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"done\":true"), "{answer}");
    assert_eq!(chat("ollama-tiny-q8").0, 200);
    let (_, tags) = serve.request("GET", "/api/tags", "", b"");
    assert!(tags.contains("ollama-tiny-q8"), "{tags}");
    // One the registry lacks ends with Ollama's error line.
    let (_, missing) = serve.post("/api/pull", r#"{"model": "nope:1", "stream": false}"#);
    assert!(missing.contains("\"error\"") && missing.contains("nope"), "{missing}");
}

/// Run `command` to its end, or kill it after `limit` and fail: a download the limits do not
/// stop would otherwise hang the suite.
fn output_within(command: &mut Command, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}, killed: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    (child.wait_with_output().unwrap(), elapsed)
}

/// `test/gated-GGUF` on `server`: one file, readable with the token `hf_secret`.
fn gated_repo(server: &Server) -> Vec<u8> {
    let bytes = fixture("tiny-qwen3-Q4_0.gguf");
    server.add_file("test/gated-GGUF", "gated-Q4_0.gguf", bytes.clone());
    server
        .state
        .lock()
        .unwrap()
        .repos
        .get_mut("test/gated-GGUF")
        .unwrap()
        .token = Some("hf_secret".into());
    bytes
}

#[test]
fn hf_token_follows_a_redirect_within_the_endpoints_origin_but_not_to_another_port_of_its_host() {
    let endpoint = Server::start();
    let other_port = Server::start();
    let bytes = gated_repo(&endpoint);
    other_port.add_blob(bytes.clone());
    let host = |url: &str| url.rsplit_once(':').unwrap().0.to_string();
    assert_eq!(
        host(&endpoint.url),
        host(&other_port.url),
        "the same host, another port"
    );
    let dir = tempfile::tempdir().unwrap();

    endpoint.state.lock().unwrap().blob_store = Some(other_port.url.clone());
    let out = minfer(&endpoint, &dir.path().join("a"))
        .env("HF_TOKEN", "hf_secret")
        .args(["pull", "hf:test/gated-GGUF"])
        .output()
        .unwrap();
    assert_eq!(std::fs::read(pulled_path(&out)).unwrap(), bytes);
    assert_eq!(
        other_port.blob_requests(),
        [BlobRequest {
            range_start: None,
            authorized: false
        }],
        "the server on another port got the token"
    );

    // A redirect to the endpoint's own origin (as Hugging Face's to /api/resolve-cache) keeps it.
    endpoint.state.lock().unwrap().blob_store = Some(endpoint.url.clone());
    let out = minfer(&endpoint, &dir.path().join("b"))
        .env("HF_TOKEN", "hf_secret")
        .args(["pull", "hf:test/gated-GGUF"])
        .output()
        .unwrap();
    assert_eq!(std::fs::read(pulled_path(&out)).unwrap(), bytes);
    assert_eq!(
        endpoint.blob_requests(),
        [BlobRequest {
            range_start: None,
            authorized: true
        }]
    );
}

#[test]
fn a_server_trickling_bytes_below_the_minimum_rate_is_given_up_keeping_what_arrived() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    // A byte every two seconds: no read ever waits the three seconds of MINFER_HTTP_TIMEOUT.
    server.faults(|f| f.trickle = Some(Duration::from_secs(2)));
    let (out, elapsed) = output_within(
        minfer(&server, dir.path())
            .env("MINFER_HTTP_TIMEOUT", "3")
            .args(["pull", "hf:test/tiny-GGUF:Q8_0"]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "{}/test/tiny-GGUF/resolve/main/tiny-qwen2-Q8_0.gguf: ",
            server.url
        )) && err.contains("bytes/s over the last")
            && err.contains("below the minimum of 1024 bytes/s")
            && err.contains("MINFER_HTTP_MIN_RATE")
            && err.contains("run again to resume"),
        "{err}"
    );
    assert_eq!(cache_names(dir.path()), ["tiny-qwen2-Q8_0.gguf.part"]);
    assert!(
        std::fs::metadata(dir.path().join("tiny-qwen2-Q8_0.gguf.part"))
            .unwrap()
            .len()
            > 0
    );

    // A listing trickled in the same way.
    let server = Server::start();
    tiny_repo(&server);
    server.faults(|f| f.trickle_listing = Some(Duration::from_millis(400)));
    let (out, elapsed) = output_within(
        minfer(&server, dir.path())
            .env("MINFER_HTTP_TIMEOUT", "1")
            .args(["pull", "hf:test/tiny-GGUF:Q4_0"]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let err = stderr(&out);
    assert!(
        err.contains("/api/models/test/tiny-GGUF/tree/main") && err.contains("below the minimum of 1024 bytes/s"),
        "{err}"
    );

    for (var, value, says) in [
        (
            "MINFER_HTTP_MIN_RATE",
            "fast",
            "expected a whole number of bytes per second",
        ),
        (
            "MINFER_HTTP_MIN_RATE",
            "-1",
            "expected a whole number of bytes per second",
        ),
        ("MINFER_HTTP_DEADLINE", "0", "expected a number of seconds above 0"),
    ] {
        let out = minfer(&server, dir.path())
            .env(var, value)
            .args(["pull", "hf:test/tiny-GGUF:Q4_0"])
            .output()
            .unwrap();
        assert!(
            stderr(&out).contains(&format!("{var}=\"{value}\": {says}")),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_download_past_its_deadline_is_given_up_even_above_the_minimum_rate() {
    let server = Server::start();
    tiny_repo(&server);
    let dir = tempfile::tempdir().unwrap();
    // Five bytes a second, above a minimum of one: only the deadline ends it.
    server.faults(|f| f.trickle = Some(Duration::from_millis(200)));
    let (out, elapsed) = output_within(
        minfer(&server, dir.path())
            .env("MINFER_HTTP_TIMEOUT", "1")
            .env("MINFER_HTTP_MIN_RATE", "1")
            .env("MINFER_HTTP_DEADLINE", "2")
            .args(["pull", "hf:test/tiny-GGUF:Q8_0"]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let err = stderr(&out);
    assert!(
        err.contains("tiny-qwen2-Q8_0.gguf: not done after 2 s")
            && err.contains("MINFER_HTTP_DEADLINE")
            && err.contains("run again to resume"),
        "{err}"
    );
    assert_eq!(cache_names(dir.path()), ["tiny-qwen2-Q8_0.gguf.part"]);
}
