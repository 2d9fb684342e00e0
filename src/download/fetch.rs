//! Fetching one model's files into the cache: under the model's lock, each file is reused if the
//! cache holds its bytes, else downloaded into `NAME.part` (resumed with `Range: bytes=N-` when a
//! previous run left one), hashed as it arrives, and renamed to its final name only once its
//! sha256 matches. One deadline covers a file's every request; the client's limits stop it
//! and keep the `.part`. The sidecar is written last, under the same lock.
//!
//! It trusts the plan it is given (names, sizes, digests); where they come from is the
//! registries' business.

use super::cache::{self, Sidecar, SidecarFile};
use super::http::{BodyError, Client};
use super::{Config, DownloadError, Plan, Progress, RemoteFile};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const CHUNK: usize = 256 << 10;

pub(super) fn fetch_model(
    client: &Client,
    config: &Config,
    reference: &str,
    plan: &Plan,
    progress: &mut dyn Progress,
) -> Result<PathBuf, DownloadError> {
    let dir = &config.cache_dir;
    let first = &plan.files[0].name;
    let lock_path = cache::lock_path(dir, first);
    let locks = lock_path.parent().expect("a lock has a directory");
    std::fs::create_dir_all(locks).map_err(DownloadError::io(locks))?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(DownloadError::io(&lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            progress.waiting(first);
            lock.lock().map_err(DownloadError::io(&lock_path))?;
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(DownloadError::io(&lock_path)(e)),
    }
    // Read under the lock: a process that held it before us may have just fetched this model.
    let old = cache::read_sidecar(dir, first);
    let mut files = Vec::with_capacity(plan.files.len());
    for file in &plan.files {
        let sha256 = match held(dir, file, old.as_ref(), &plan.origin, reference)? {
            Some(sha256) => sha256,
            None => download(client, config, file, progress)?,
        };
        files.push(SidecarFile {
            name: file.name.clone(),
            size: file.size,
            sha256,
            url: file.url.clone(),
        });
    }
    let mut references = match old {
        Some(old) if old.files == files => old.references,
        _ => Vec::new(),
    };
    references.retain(|r| r != reference);
    references.push(reference.to_string());
    cache::write_sidecar(
        dir,
        first,
        &Sidecar {
            origin: plan.origin.clone(),
            references,
            files,
        },
    )?;
    Ok(dir.join(first))
}

/// The sha256 of `file` if the cache already holds its bytes under its name; `None` if it must
/// be fetched. A different file of that name is replaced only if it came from the same origin
/// (an older version); anything else is somebody's file, and refused.
fn held(
    dir: &Path,
    file: &RemoteFile,
    old: Option<&Sidecar>,
    origin: &str,
    reference: &str,
) -> Result<Option<String>, DownloadError> {
    let path = dir.join(&file.name);
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(None);
    };
    let recorded = old.and_then(|s| s.files.iter().find(|f| f.name == file.name));
    if let Some(rec) = recorded {
        let same_digest = file.sha256.as_ref().is_none_or(|sha| *sha == rec.sha256);
        if same_digest && rec.size == file.size && meta.len() == file.size {
            return Ok(Some(rec.sha256.clone()));
        }
    }
    if let Some(sha) = &file.sha256 {
        if meta.len() == file.size && hash_file(&path)? == *sha {
            return Ok(Some(sha.clone()));
        }
    }
    let ours = old.is_some_and(|s| s.origin == origin) && recorded.is_some();
    if ours {
        Ok(None)
    } else {
        Err(DownloadError::Conflict {
            path,
            source_ref: old.and_then(|s| s.references.last().cloned()),
            reference: reference.to_string(),
        })
    }
}

fn hash_file(path: &Path) -> Result<String, DownloadError> {
    let mut f = File::open(path).map_err(DownloadError::io(path))?;
    let mut hasher = Sha256::new();
    hash_prefix(&mut f, u64::MAX, &mut hasher).map_err(DownloadError::io(path))?;
    Ok(hex(&hasher.finalize()))
}

/// Feed the first `n` bytes of `f` (all of them if fewer) to `hasher`.
fn hash_prefix(f: &mut File, n: u64, hasher: &mut Sha256) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut left = n;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = f.read(&mut buf[..want])?;
        if got == 0 {
            break;
        }
        hasher.update(&buf[..got]);
        left -= got as u64;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Download `file` into the cache under its final name; returns its sha256.
fn download(
    client: &Client,
    config: &Config,
    file: &RemoteFile,
    progress: &mut dyn Progress,
) -> Result<String, DownloadError> {
    let dir = &config.cache_dir;
    let target = dir.join(&file.name);
    let part_path = dir.join(format!("{}.part", file.name));
    let io = DownloadError::io(&part_path);
    let mut part = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&part_path)
        .map_err(DownloadError::io(&part_path))?;
    let mut held = part.metadata().map_err(DownloadError::io(&part_path))?.len();
    let mut hasher = Sha256::new();
    if held > file.size {
        held = 0;
    }
    // What a previous run left is hashed again: the digest must cover every byte.
    hash_prefix(&mut part, held, &mut hasher).map_err(DownloadError::io(&part_path))?;
    part.set_len(held).map_err(DownloadError::io(&part_path))?;
    part.seek(SeekFrom::Start(held))
        .map_err(DownloadError::io(&part_path))?;
    let mut restarted = false;
    // One deadline for the file, however many requests it takes.
    let by = client.deadline_from_now();
    while held < file.size {
        let mut headers = Vec::new();
        if held > 0 {
            headers.push(("Range", format!("bytes={held}-")));
        }
        if let (Some(_), Some(token)) = (&file.auth_repo, &config.hf_token) {
            headers.push(("Authorization", format!("Bearer {token}")));
        }
        let response = client.get_by(&file.url, &headers, by)?;
        let status = response.status();
        let resumed = match status {
            200 => false,
            206 if held > 0 => {
                let start = response
                    .header("content-range")
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split_once('-'))
                    .and_then(|(start, _)| start.trim().parse::<u64>().ok());
                start == Some(held)
            }
            // A partial file the server does not recognise (it changed, or ours is corrupt).
            416 if held > 0 && !restarted => false,
            401 | 403 if file.auth_repo.is_some() => {
                return Err(DownloadError::Unauthorized {
                    repo: file.auth_repo.clone().unwrap_or_default(),
                    status,
                    token_given: config.hf_token.is_some(),
                })
            }
            _ => return Err(response.status_error()),
        };
        if !resumed {
            // The server sends the whole file (or cannot resume ours): start over.
            if held > 0 {
                if restarted {
                    return Err(DownloadError::BadResponse {
                        url: file.url.clone(),
                        reason: format!("the server refused to resume at byte {held} twice"),
                    });
                }
                restarted = true;
                held = 0;
                hasher = Sha256::new();
                part.set_len(0).map_err(DownloadError::io(&part_path))?;
                part.seek(SeekFrom::Start(0)).map_err(DownloadError::io(&part_path))?;
            }
            if status != 200 {
                continue;
            }
        }
        progress.start(&file.name, file.size, held);
        let mut body = response.into_body(held > 0);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    // Keep what arrived for the next run.
                    let _ = part.sync_data();
                    return Err(match e {
                        BodyError::Limit(e) => e,
                        BodyError::Io(e) => DownloadError::Interrupted {
                            name: file.name.clone(),
                            got: held,
                            expected: file.size,
                            reason: e.to_string(),
                        },
                    });
                }
            };
            if held + n as u64 > file.size {
                drop(part);
                let _ = std::fs::remove_file(&part_path);
                return Err(DownloadError::TooLong {
                    name: file.name.clone(),
                    expected: file.size,
                });
            }
            part.write_all(&buf[..n]).map_err(DownloadError::io(&part_path))?;
            hasher.update(&buf[..n]);
            held += n as u64;
            progress.advance(held);
        }
        if held < file.size {
            let _ = part.sync_data();
            return Err(DownloadError::Interrupted {
                name: file.name.clone(),
                got: held,
                expected: file.size,
                reason: "the connection closed early".into(),
            });
        }
    }
    let got = hex(&hasher.finalize());
    if let Some(expected) = &file.sha256 {
        if got != *expected {
            drop(part);
            let _ = std::fs::remove_file(&part_path);
            return Err(DownloadError::HashMismatch {
                name: file.name.clone(),
                expected: expected.clone(),
                got,
            });
        }
    }
    part.sync_all().map_err(io)?;
    drop(part);
    std::fs::rename(&part_path, &target).map_err(DownloadError::io(&target))?;
    // The rename is durable once the directory is; a failure here loses nothing but that.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    progress.finish();
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_spells_a_digest_in_lowercase() {
        let digest = Sha256::digest(b"abc");
        assert_eq!(
            hex(&digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
