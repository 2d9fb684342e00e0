//! The CUDA kernel sources and their compilation: NVRTC turns each `.cu` file of `kernels/`
//! (with `common.cuh` in front) into PTX for one compute capability, and the PTX is cached on
//! disk, keyed by the source's hash, the capability and NVRTC's version, so that a second start
//! compiles nothing.
//!
//! Needs only NVRTC, never a driver or a device: the test suite compiles every kernel on
//! machines without a GPU. Must not launch anything.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// The file's name under `kernels/`, and the module's name in errors and the cache.
    pub name: &'static str,
    /// The file's text.
    pub text: &'static str,
}

/// Every kernel source, in the order the device loads them.
pub const SOURCES: [KernelSource; 2] = [
    KernelSource {
        name: "weights.cu",
        text: include_str!("kernels/weights.cu"),
    },
    KernelSource {
        name: "ops.cu",
        text: include_str!("kernels/ops.cu"),
    },
];

const COMMON: &str = include_str!("kernels/common.cuh");

/// The compute capabilities the test suite compiles every kernel for: Ampere (A100) and Hopper
/// (H100, H200).
pub const TESTED_CAPABILITIES: [u32; 2] = [80, 90];

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The NVRTC library is not on the loader path.
    #[error(
        "NVRTC could not be loaded: looked for libnvrtc.so, libnvrtc.so.13 and older versions on the \
         loader path (LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    /// NVRTC refused a source; `log` is its compile log.
    #[error("NVRTC could not compile kernel source '{source_name}' for compute_{capability}: {log}")]
    Compile {
        /// The source file's name.
        source_name: &'static str,
        /// The compute capability asked for (90 for 9.0).
        capability: u32,
        /// NVRTC's message and log.
        log: String,
    },
}

/// Whether NVRTC can be loaded on this machine.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library and drops the handle.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); the out-pointers are valid.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status.result().map_err(|e| CompileError::Compile {
        source_name: "(version query)",
        capability: 0,
        log: format!("{e:?}"),
    })?;
    Ok((major, minor))
}

/// The text NVRTC compiles for `source`: the common header, then the file, with line numbers in
/// NVRTC's messages counted from the file's own first line.
pub fn full_text(source: &KernelSource) -> String {
    format!("{COMMON}\n#line 1 \"{}\"\n{}", source.name, source.text)
}

/// Compile `source` to PTX for compute capability `capability` (80 for 8.0).
pub fn compile(source: &KernelSource, capability: u32) -> Result<String, CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NoNvrtc);
    }
    let options = cudarc::nvrtc::CompileOptions {
        name: Some(source.name.to_string()),
        options: vec![format!("--gpu-architecture=compute_{capability}")],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(full_text(source), options).map_err(|e| {
        let log = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        CompileError::Compile {
            source_name: source.name,
            capability,
            log,
        }
    })?;
    Ok(ptx.to_src())
}

/// Where compiled kernels are cached: `$MINFER_CUDA_CACHE`, else `$XDG_CACHE_HOME/minfer/cuda`,
/// else `~/.cache/minfer/cuda`; `None` when there is no home to put it in.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MINFER_CUDA_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(base) = std::env::var_os("XDG_CACHE_HOME").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(base).join("minfer/cuda"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/minfer/cuda"))
}

/// The cache file of `source` compiled for `capability` by NVRTC `version`.
pub fn cache_file(dir: &Path, source: &KernelSource, capability: u32, version: (i32, i32)) -> PathBuf {
    let hash = Sha256::digest(full_text(source).as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let stem = source.name.trim_end_matches(".cu");
    dir.join(format!(
        "{stem}-{hex}-compute_{capability}-nvrtc{}.{}.ptx",
        version.0, version.1
    ))
}

/// PTX of `source` for `capability`, from the cache in `dir` when it is there, else compiled
/// and stored there (a cache that cannot be written only costs the next start a compile).
/// Returns the PTX and whether it was compiled now.
pub fn compile_cached(
    source: &KernelSource,
    capability: u32,
    dir: Option<&Path>,
) -> Result<(String, bool), CompileError> {
    let version = nvrtc_version()?;
    let file = dir.map(|d| cache_file(d, source, capability, version));
    if let Some(ptx) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        if ptx.contains(".version") {
            return Ok((ptx, false));
        }
    }
    let ptx = compile(source, capability)?;
    if let (Some(dir), Some(file)) = (dir, file) {
        // Written to a new file beside the final name (created exclusively: never through a
        // link planted in the cache), then renamed: a concurrent start never reads half a file.
        // A cache that cannot be written only costs the next start a compile.
        let _ = std::fs::create_dir_all(dir)
            .and_then(|()| crate::fs_safe::replace_with(&file, |out| std::io::Write::write_all(out, ptx.as_bytes())));
    }
    Ok((ptx, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC is on the loader path in CI (`scripts/test.sh` installs it and sets
    /// `MINFER_REQUIRE_NVRTC=1`); a developer's machine without it skips these tests, loudly.
    fn nvrtc_or_skip(test: &str) -> bool {
        if nvrtc_present() {
            return true;
        }
        assert!(
            std::env::var("MINFER_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "MINFER_REQUIRE_NVRTC=1 but NVRTC could not be loaded (is the virtualenv's nvidia/cu13/lib on LD_LIBRARY_PATH?)"
        );
        eprintln!("{test}: skipped, NVRTC is not on the loader path (scripts/test.sh provides it)");
        false
    }

    #[test]
    fn every_kernel_source_compiles_for_compute_80_and_90() {
        if !nvrtc_or_skip("every_kernel_source_compiles_for_compute_80_and_90") {
            return;
        }
        for source in &SOURCES {
            for capability in TESTED_CAPABILITIES {
                let ptx = compile(source, capability).unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    ptx.contains(&format!(".target sm_{capability}")),
                    "{}: {ptx:.200}",
                    source.name
                );
            }
        }
    }

    #[test]
    fn every_kernel_the_backend_launches_is_in_the_compiled_modules() {
        if !nvrtc_or_skip("every_kernel_the_backend_launches_is_in_the_compiled_modules") {
            return;
        }
        let ptx: String = SOURCES.iter().map(|s| compile(s, 90).unwrap()).collect();
        for name in super::super::KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "no kernel '{name}' in the PTX"
            );
        }
    }

    #[test]
    fn a_kernel_that_does_not_compile_is_refused_with_nvrtcs_log() {
        if !nvrtc_or_skip("a_kernel_that_does_not_compile_is_refused_with_nvrtcs_log") {
            return;
        }
        let bad = KernelSource {
            name: "bad.cu",
            text: "extern \"C\" __global__ void k(float* x) { x[i] = 0.0f; }",
        };
        let err = compile(&bad, 90).unwrap_err().to_string();
        assert!(err.contains("bad.cu") && err.contains("compute_90"), "{err}");
        assert!(err.contains("\"i\" is undefined"), "{err}");
    }

    #[test]
    fn a_second_compile_is_read_from_the_cache() {
        if !nvrtc_or_skip("a_second_compile_is_read_from_the_cache") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (first, compiled) = compile_cached(&SOURCES[1], 80, Some(dir.path())).unwrap();
        assert!(compiled);
        let (second, compiled_again) = compile_cached(&SOURCES[1], 80, Some(dir.path())).unwrap();
        assert!(!compiled_again);
        assert_eq!(first, second);
        // Another capability is another entry.
        let (_, compiled_90) = compile_cached(&SOURCES[1], 90, Some(dir.path())).unwrap();
        assert!(compiled_90);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn the_cache_key_changes_with_the_source_the_capability_and_the_version() {
        let dir = Path::new("/cache");
        let a = cache_file(dir, &SOURCES[0], 90, (13, 0));
        assert_ne!(a, cache_file(dir, &SOURCES[1], 90, (13, 0)));
        assert_ne!(a, cache_file(dir, &SOURCES[0], 80, (13, 0)));
        assert_ne!(a, cache_file(dir, &SOURCES[0], 90, (12, 8)));
        let edited = KernelSource {
            name: SOURCES[0].name,
            text: "// edited\n",
        };
        assert_ne!(a, cache_file(dir, &edited, 90, (13, 0)));
    }
}
