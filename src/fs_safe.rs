//! Files in directories other people can write to: a temporary file created beside its
//! destination exclusively (`create_new`, `O_EXCL`: never through a link planted at its name,
//! never into a file already there) under a name nobody can predict, for the caller to fill and
//! rename over the destination; a path opened for reading without blocking on a FIFO or a
//! device, so that its kind can be checked before a read waits forever; and the name of a kind
//! of file, for messages.
//!
//! It knows nothing of what the files hold; every subsystem keeps its own errors and wraps the
//! `std::io::Error`s returned here.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Names tried before giving up: a clash needs another process to have guessed the random part,
/// so more than one or two tries means someone is filling the directory on purpose.
const ATTEMPTS: usize = 16;

/// The longest part of the destination's name kept in the temporary name, in bytes: the rest
/// of the name (dot, pid, counter, random part, `.tmp`) must fit a file system's 255.
const MAX_STEM_BYTES: usize = 160;

/// Create a new, empty temporary file in `dest`'s directory, named
/// `.{dest's name}.{pid}.{counter}.{random}.tmp`, opened for writing; returns it and its path.
/// The name is new to the directory (the file is created exclusively, a link at the name is
/// never followed) and unpredictable (random bits from the process's hash keys and the clock).
pub fn create_temp_beside(dest: &Path) -> io::Result<(File, PathBuf)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = dest.file_name().map_or_else(
        || "file".to_string(),
        |n| truncated(&n.to_string_lossy(), MAX_STEM_BYTES).to_string(),
    );
    let candidates = (0..ATTEMPTS).map(|_| {
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed);
        dest.with_file_name(format!(
            ".{name}.{}.{counter}.{:012x}.tmp",
            std::process::id(),
            random_bits(counter) & 0xffff_ffff_ffff
        ))
    });
    create_first_free(dest, candidates)
}

/// Replaces `dest` with what `fill` writes: into a new file from [`create_temp_beside`], closed,
/// then renamed over `dest`, so readers see the old file or the new one, never a part. On
/// failure the temporary file is removed and `dest` is untouched. `fill` syncs the file itself
/// where the contents must survive a crash.
pub fn replace_with(dest: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let (mut file, temp) = create_temp_beside(dest)?;
    let written = fill(&mut file);
    // Closed before the rename, which some systems refuse for an open file.
    drop(file);
    let result = written.and_then(|()| std::fs::rename(&temp, dest));
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The first of `candidates` that can be created as a new file; `dest` names the error when
/// every one is taken.
fn create_first_free(dest: &Path, candidates: impl Iterator<Item = PathBuf>) -> io::Result<(File, PathBuf)> {
    for path in candidates {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{ATTEMPTS} temporary names beside {} were all taken", dest.display()),
    ))
}

/// 64 bits no other process can predict: std's hash keys are seeded from the system's random
/// source, and the clock's nanoseconds vary them further.
fn random_bits(counter: u64) -> u64 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((nanos, counter, std::process::id()))
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Open `path` for reading without waiting: on Unix with `O_NONBLOCK`, so that a FIFO with no
/// writer (or a device) does not block the open, and the caller can check
/// [`File::metadata`]'s kind before reading. Reads from a regular file ignore the flag.
/// Elsewhere a plain open.
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// What a file that is not a regular file is, for messages: "a FIFO", "a directory", ...
pub fn describe(kind: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn temporary_files_are_new_hidden_files_beside_the_destination_with_different_names() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("model.gguf");
        let (mut a, a_path) = create_temp_beside(&dest).unwrap();
        let (_, b_path) = create_temp_beside(&dest).unwrap();
        assert_ne!(a_path, b_path);
        for p in [&a_path, &b_path] {
            assert_eq!(p.parent(), Some(dir.path()));
            let name = p.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with(".model.gguf.") && name.ends_with(".tmp"), "{name}");
        }
        a.write_all(b"x").unwrap();
        assert_eq!(std::fs::read(&a_path).unwrap(), b"x");
        assert!(!dest.exists());
    }

    #[test]
    fn a_long_destination_name_still_gives_a_name_the_file_system_takes() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join(format!("{}.gguf", "é".repeat(120)));
        let (_, path) = create_temp_beside(&dest).unwrap();
        assert!(path.file_name().unwrap().len() <= 255);
    }

    #[cfg(unix)]
    #[test]
    fn a_link_or_a_file_at_a_candidate_name_is_skipped_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let linked = dir.path().join("linked.tmp");
        std::os::unix::fs::symlink(&victim, &linked).unwrap();
        let dangling = dir.path().join("dangling.tmp");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let free = dir.path().join("free.tmp");
        let (mut file, path) = create_first_free(
            &victim,
            [linked.clone(), dangling.clone(), victim.clone(), free.clone()].into_iter(),
        )
        .unwrap();
        assert_eq!(path, free);
        file.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(
            !dir.path().join("nowhere").exists(),
            "the dangling link was not followed"
        );

        let taken = create_first_free(&victim, [linked, dangling].into_iter()).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AlreadyExists);
        assert!(taken.to_string().contains("victim"), "{taken}");
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_opens_without_a_writer_and_says_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let file = open_nonblocking(&fifo).unwrap();
        assert_eq!(describe(file.metadata().unwrap().file_type()), "a FIFO");
        assert_eq!(
            describe(std::fs::metadata(dir.path()).unwrap().file_type()),
            "a directory"
        );
    }
}
