//! The kernel choice's cache and the identities it is keyed by: the CPU (CPUID's vendor,
//! family, model, stepping and brand) and this binary (its version, size and build time). A
//! cached choice is taken only for the same identity and instruction-set ceiling, and only where
//! it names kernels and distances that are still candidates; a file that cannot be read or parsed
//! is measured over and rewritten, never trusted.

use super::{candidates, has_prefetch_distance, Choice, Kernel, Why, PREFETCH_DISTANCES};
use crate::quant::simd::Isa;
use crate::quant::GgmlType;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a cached choice is valid for: this CPU, this binary, this instruction-set ceiling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct CacheKey {
    pub(super) cpu: String,
    /// `None` where this binary cannot be told from a rebuilt one: nothing is cached then.
    pub(super) binary: Option<String>,
    pub(super) ceiling: String,
}

/// This CPU and this binary, as a cached choice is keyed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) cpu: String,
    pub(super) binary: Option<String>,
}

impl Identity {
    pub(super) fn here() -> Identity {
        Identity {
            cpu: cpu_model(),
            binary: binary_version(),
        }
    }
}

/// The CPU's vendor, family, model, stepping and brand string, as CPUID reports them.
pub fn cpu_model() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // CPUID is present on every x86-64 CPU; the brand leaves are read only where the
        // extended maximum leaf covers them.
        {
            let vendor_leaf = __cpuid(0);
            let vendor: Vec<u8> = [vendor_leaf.ebx, vendor_leaf.edx, vendor_leaf.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .collect();
            let eax = __cpuid(1).eax;
            let (base_family, base_model) = ((eax >> 8) & 0xf, (eax >> 4) & 0xf);
            let family = if base_family == 0xf {
                base_family + ((eax >> 20) & 0xff)
            } else {
                base_family
            };
            let model = if base_family == 0x6 || base_family == 0xf {
                base_model | ((eax >> 16) & 0xf) << 4
            } else {
                base_model
            };
            let mut brand = Vec::new();
            if __cpuid(0x8000_0000).eax >= 0x8000_0004 {
                for leaf in 0x8000_0002u32..=0x8000_0004 {
                    let r = __cpuid(leaf);
                    brand.extend([r.eax, r.ebx, r.ecx, r.edx].iter().flat_map(|x| x.to_le_bytes()));
                }
            }
            let brand = String::from_utf8_lossy(&brand).trim_matches(['\0', ' ']).to_string();
            format!(
                "{} family {family} model {model} stepping {} ({brand})",
                String::from_utf8_lossy(&vendor),
                eax & 0xf
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// This binary's version: the crate's, and the size and modification time of the executable
/// (a rebuilt binary may carry different kernels). `None` when the executable cannot be read.
fn binary_version() -> Option<String> {
    let meta = std::env::current_exe().and_then(std::fs::metadata).ok()?;
    let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(format!(
        "minfer {} {} bytes {}.{:09}",
        env!("CARGO_PKG_VERSION"),
        meta.len(),
        modified.as_secs(),
        modified.subsec_nanos()
    ))
}

/// Where the choices are cached: `$MINFER_KERNEL_CACHE` (empty: nowhere), else
/// `$XDG_CACHE_HOME/minfer/kernels.json`, else `~/.cache/minfer/kernels.json`.
pub fn cache_file() -> Option<PathBuf> {
    if let Some(file) = std::env::var_os("MINFER_KERNEL_CACHE") {
        return (!file.is_empty()).then(|| PathBuf::from(file));
    }
    if let Some(base) = std::env::var_os("XDG_CACHE_HOME").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(base).join("minfer/kernels.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".cache/minfer/kernels.json"))
}

/// The cache: the choices of the most recent identities (several binaries may share a CPU, as
/// a test suite's do).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct CacheFile {
    pub(super) entries: Vec<CacheEntry>,
}

/// At most this many identities are kept, the most recent.
const CACHE_ENTRIES: usize = 32;

/// A cache file larger than this is not read (it is rewritten).
const CACHE_MAX_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct CacheEntry {
    pub(super) key: CacheKey,
    pub(super) choices: Vec<CachedChoice>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct CachedChoice {
    #[serde(rename = "type")]
    pub(super) ty: String,
    pub(super) kernel: String,
    pub(super) gbps: Vec<(String, f64)>,
    #[serde(default)]
    pub(super) prefetch_records: Option<usize>,
    #[serde(default)]
    pub(super) prefetch_gbps: Vec<(usize, f64)>,
}

impl CacheEntry {
    /// The cached choice for `ty`, if it names a kernel that is still a candidate.
    pub(super) fn choice(&self, ty: GgmlType, ceiling: Isa) -> Option<Choice> {
        let c = self.choices.iter().find(|c| c.ty == ty.name())?;
        let kernel = Kernel::from_name(&c.kernel).filter(|k| candidates(ty, ceiling).contains(k))?;
        let gbps = c
            .gbps
            .iter()
            .map(|(k, g)| Some((Kernel::from_name(k)?, *g)))
            .collect::<Option<Vec<_>>>()?;
        let prefetch_records = c.prefetch_records.filter(|d| PREFETCH_DISTANCES.contains(d));
        if kernel == Kernel::Repacked && prefetch_records.is_none() && has_prefetch_distance(ty) {
            return None;
        }
        Some(Choice {
            ty,
            kernel,
            why: Why::Cached,
            gbps,
            prefetch_records: prefetch_records.filter(|_| kernel == Kernel::Repacked),
            prefetch_gbps: c.prefetch_gbps.clone(),
        })
    }
}

/// The entry of `key` in the cache file at `path`, if the file holds one (an unreadable or
/// malformed file holds none).
pub(super) fn read_cache(path: &Path, key: &CacheKey) -> Option<CacheEntry> {
    read_cache_file(path).entries.into_iter().find(|e| &e.key == key)
}

fn read_cache_file(path: &Path) -> CacheFile {
    use std::io::Read;
    let read = || -> std::io::Result<Vec<u8>> {
        let file = crate::fs_safe::open_nonblocking(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let mut bytes = Vec::new();
        file.take(CACHE_MAX_BYTES).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    read()
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Puts `choices` under `key` in the cache file at `path`, most recent first (a cache that
/// cannot be written only costs the next start a measurement).
pub(super) fn write_cache(path: &Path, key: &CacheKey, choices: &[Choice]) {
    let mut file = read_cache_file(path);
    file.entries.retain(|e| &e.key != key);
    let entry = CacheEntry {
        key: key.clone(),
        choices: choices
            .iter()
            .filter(|c| c.why == Why::Measured || c.why == Why::Cached)
            .map(|c| CachedChoice {
                ty: c.ty.name().to_string(),
                kernel: c.kernel.name().to_string(),
                gbps: c.gbps.iter().map(|(k, g)| (k.name().to_string(), *g)).collect(),
                prefetch_records: c.prefetch_records,
                prefetch_gbps: c.prefetch_gbps.clone(),
            })
            .collect(),
    };
    file.entries.insert(0, entry);
    file.entries.truncate(CACHE_ENTRIES);
    let Ok(text) = serde_json::to_vec_pretty(&file) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = crate::fs_safe::replace_with(path, |out| std::io::Write::write_all(out, &text));
}
