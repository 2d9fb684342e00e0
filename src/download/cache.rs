//! The model cache: a directory of GGUF files (`$MINFER_MODELS`, default
//! `~/.cache/minfer/models`, the one `scripts/fetch-model.sh` fills), each fetched one with a
//! sidecar `NAME.gguf.json` saying where it came from and what its bytes hash to. A split model
//! has one sidecar, beside its first part, listing every part.
//!
//! Only verified files carry a final `.gguf` name: downloads in progress are `NAME.gguf.part`,
//! and the per-model locks live in `.locks/`. This module reads and writes those names; it does
//! not fetch.

use super::DownloadError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The sidecars are small; a larger one is not ours and is ignored.
const MAX_SIDECAR_BYTES: u64 = 1 << 20;

/// The cache directory the environment names: `$MINFER_MODELS`, else `~/.cache/minfer/models`.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MINFER_MODELS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    home.join(".cache/minfer/models")
}

/// Where a cached model came from: `NAME.gguf.json` beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sidecar {
    /// `hf:OWNER/REPO` or `ollama:NAME`: a newer version from the same origin may replace it.
    pub origin: String,
    /// The references that resolved to it, canonical spelling (`hf:OWNER/REPO:Q4_K_M`), most
    /// recent last.
    pub references: Vec<String>,
    /// Its files: one, or the parts of a split model in order.
    pub files: Vec<SidecarFile>,
}

/// One file of a cached model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarFile {
    /// Its name in the cache.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256, lowercase hex, as verified when it was fetched.
    pub sha256: String,
    /// Where it was fetched from.
    pub url: String,
}

/// The sidecar of the model whose (first) file is `name`.
pub fn sidecar_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

/// The sidecar of `name`, if it has a readable one.
pub fn read_sidecar(dir: &Path, name: &str) -> Option<Sidecar> {
    let path = sidecar_path(dir, name);
    if std::fs::metadata(&path).ok()?.len() > MAX_SIDECAR_BYTES {
        return None;
    }
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Write `sidecar` for `name`: to a new temporary file first (created exclusively, so a link
/// planted in the cache is never written through), renamed into place, so a reader sees the old
/// one or the new one, never half of one.
pub fn write_sidecar(dir: &Path, name: &str, sidecar: &Sidecar) -> Result<(), DownloadError> {
    let path = sidecar_path(dir, name);
    let json = serde_json::to_vec_pretty(sidecar).expect("a sidecar serializes");
    crate::fs_safe::replace_with(&path, |f| {
        f.write_all(&json)?;
        f.write_all(b"\n")?;
        f.sync_all()
    })
    .map_err(DownloadError::io(&path))
}

/// The lock file of the model whose first file is `name`. Lock files are never deleted:
/// deleting one while another process waits on it would let a third take a fresh one.
pub fn lock_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(".locks").join(format!("{name}.lock"))
}

/// Whether every file a sidecar lists is in the cache with its recorded size.
fn complete(dir: &Path, sidecar: &Sidecar) -> bool {
    !sidecar.files.is_empty()
        && sidecar
            .files
            .iter()
            .all(|f| std::fs::metadata(dir.join(&f.name)).is_ok_and(|m| m.is_file() && m.len() == f.size))
}

/// The cached model a canonical reference was fetched as, if it is complete.
pub fn find_reference(dir: &Path, reference: &str) -> Result<Option<PathBuf>, DownloadError> {
    for (name, sidecar) in sidecars(dir)? {
        if sidecar.references.iter().any(|r| r == reference) && complete(dir, &sidecar) {
            return Ok(Some(dir.join(name)));
        }
    }
    Ok(None)
}

/// A plain name in the cache: `NAME` or `NAME.gguf`. Only final names count, so a download in
/// progress is never found.
pub fn find_name(dir: &Path, name: &str) -> Result<Option<PathBuf>, DownloadError> {
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Ok(None);
    }
    for candidate in [name.to_string(), format!("{name}.gguf")] {
        if !candidate.ends_with(".gguf") {
            continue;
        }
        let path = dir.join(&candidate);
        if path.is_file() {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Every `(model name, sidecar)` of the cache.
fn sidecars(dir: &Path) -> Result<Vec<(String, Sidecar)>, DownloadError> {
    let mut found = Vec::new();
    for name in gguf_names(dir)? {
        if let Some(sidecar) = read_sidecar(dir, &name) {
            found.push((name, sidecar));
        }
    }
    Ok(found)
}

/// The final `.gguf` file names in the cache, sorted; a missing cache has none.
fn gguf_names(dir: &Path) -> Result<Vec<String>, DownloadError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DownloadError::io(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(DownloadError::io(dir))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.ends_with(".gguf") && !name.starts_with('.') && entry.path().is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// One model of the cache, as `minfer list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The (first) file's name.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// Bytes, all parts together.
    pub size: u64,
    /// Parts held (1 unless split).
    pub parts: u32,
    /// Parts the name announces (1 unless split).
    pub parts_expected: u32,
    /// The reference it was last fetched as, or `None` for a file put there by hand.
    pub source: Option<String>,
}

/// The models of the cache, a split model's parts folded into one entry.
pub fn entries(dir: &Path) -> Result<Vec<CacheEntry>, DownloadError> {
    let names = gguf_names(dir)?;
    let mut list: Vec<CacheEntry> = Vec::new();
    for name in &names {
        let path = dir.join(name);
        let size = std::fs::metadata(&path).map_err(DownloadError::io(&path))?.len();
        let mut parts_expected = 1;
        if let Some((prefix, no, count)) = crate::gguf::split::parse_split_path(name) {
            if no > 0 {
                let first = crate::gguf::split::split_path(prefix, 0, count);
                if let Some(entry) = list.iter_mut().find(|e| e.name == first) {
                    entry.size += size;
                    entry.parts += 1;
                    continue;
                }
            }
            parts_expected = count;
        }
        let source = read_sidecar(dir, name).and_then(|s| s.references.last().cloned());
        list.push(CacheEntry {
            name: name.clone(),
            path,
            size,
            parts: 1,
            parts_expected,
            source,
        });
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar(reference: &str, files: &[(&str, u64)]) -> Sidecar {
        Sidecar {
            origin: "hf:a/b".into(),
            references: vec![reference.into()],
            files: files
                .iter()
                .map(|(name, size)| SidecarFile {
                    name: name.to_string(),
                    size: *size,
                    sha256: "0".repeat(64),
                    url: "http://x".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_reference_is_found_only_while_all_its_parts_are_there() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (p1, p2) = ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf");
        std::fs::write(d.join(p1), b"abc").unwrap();
        write_sidecar(d, p1, &sidecar("hf:a/b:Q8_0", &[(p1, 3), (p2, 2)])).unwrap();
        assert_eq!(find_reference(d, "hf:a/b:Q8_0").unwrap(), None, "second part missing");
        std::fs::write(d.join(p2), b"de").unwrap();
        assert_eq!(find_reference(d, "hf:a/b:Q8_0").unwrap(), Some(d.join(p1)));
        assert_eq!(find_reference(d, "hf:a/b:Q4_0").unwrap(), None);
        std::fs::write(d.join(p2), b"d").unwrap();
        assert_eq!(
            find_reference(d, "hf:a/b:Q8_0").unwrap(),
            None,
            "a part of the wrong size"
        );
    }

    #[test]
    fn a_plain_name_finds_final_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("x.gguf"), b"").unwrap();
        std::fs::write(d.join("y.gguf.part"), b"").unwrap();
        assert_eq!(find_name(d, "x").unwrap(), Some(d.join("x.gguf")));
        assert_eq!(find_name(d, "x.gguf").unwrap(), Some(d.join("x.gguf")));
        assert_eq!(find_name(d, "y.gguf").unwrap(), None);
        assert_eq!(find_name(d, "y.gguf.part").unwrap(), None);
        assert_eq!(find_name(d, "../x.gguf").unwrap(), None);
    }

    #[test]
    fn the_listing_folds_split_parts_and_skips_partial_downloads() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a-00001-of-00002.gguf"), [0u8; 10]).unwrap();
        std::fs::write(d.join("a-00002-of-00002.gguf"), [0u8; 5]).unwrap();
        std::fs::write(d.join("b.gguf"), [0u8; 7]).unwrap();
        std::fs::write(d.join("c.gguf.part"), [0u8; 7]).unwrap();
        write_sidecar(d, "b.gguf", &sidecar("ollama:b:latest", &[("b.gguf", 7)])).unwrap();
        let list = entries(d).unwrap();
        assert_eq!(list.len(), 2, "{list:?}");
        assert_eq!((list[0].size, list[0].parts, list[0].parts_expected), (15, 2, 2));
        assert_eq!(list[0].source, None);
        assert_eq!(list[1].source.as_deref(), Some("ollama:b:latest"));
        assert_eq!(entries(&d.join("missing")).unwrap(), Vec::new());
    }
}
