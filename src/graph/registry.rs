//! The backend registry: every backend minfer knows by name, its fixed id, its assignment
//! priority, whether this build contains it and whether this machine can run it; and the fence
//! (`--backend NAME` / `MINFER_BACKENDS`) that restricts which participate.
//!
//! The three refusals are distinct on purpose: an unknown name is a typo, a backend not in
//! this build needs a different build, and one not usable here needs different hardware.

use super::backend::Backend;

/// One known backend: its handle, name, priority and whether it can be used.
pub struct BackendEntry {
    /// Its fixed id.
    pub handle: Backend,
    /// The name `--backend` and `MINFER_BACKENDS` take (matched case-insensitively).
    pub name: &'static str,
    /// Higher is offered nodes first. A pinned number: assignment is topology.
    pub priority: u32,
    /// Whether this build contains the backend.
    pub compiled: bool,
    /// Whether this machine can run it (only asked when compiled).
    pub available: fn() -> bool,
}

fn always() -> bool {
    true
}

fn never() -> bool {
    false
}

static ENTRIES: [BackendEntry; 3] = [
    BackendEntry {
        handle: Backend::METAL,
        name: "metal",
        priority: 300,
        compiled: false,
        available: never,
    },
    BackendEntry {
        handle: Backend::CUDA,
        name: "cuda",
        priority: 200,
        compiled: false,
        available: never,
    },
    BackendEntry {
        handle: Backend::CPU,
        name: "cpu",
        priority: 100,
        compiled: true,
        available: always,
    },
];

/// Every known backend, highest priority first.
pub fn entries() -> &'static [BackendEntry] {
    &ENTRIES
}

/// The entry of backend `handle`, if minfer knows it.
pub fn entry(handle: Backend) -> Option<&'static BackendEntry> {
    ENTRIES.iter().find(|e| e.handle == handle)
}

/// Why a backend fence was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// A name in the fence is no backend minfer knows (a typo).
    #[error("unknown backend '{name}' (known backends: {known})")]
    Unknown {
        /// The name as given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// The backend is known but this build does not contain it.
    #[error("backend '{name}' is not part of this build of minfer")]
    NotCompiled {
        /// The backend's name.
        name: String,
    },
    /// The backend is built in but this machine cannot run it.
    #[error("backend '{name}' is built in but not usable on this machine")]
    Unavailable {
        /// The backend's name.
        name: String,
    },
    /// The fence names no backend at all (an empty or blank list).
    #[error("the backend fence is empty")]
    Empty,
}

/// Resolve a fence: a comma-separated list of backend names, or `None` for every backend this
/// build has and this machine can run. The result is in priority order.
pub fn resolve_fence(names: Option<&str>) -> Result<Vec<Backend>, RegistryError> {
    let Some(names) = names else {
        return Ok(ENTRIES
            .iter()
            .filter(|e| e.compiled && (e.available)())
            .map(|e| e.handle)
            .collect());
    };
    let mut chosen = Vec::new();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let e = ENTRIES
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| RegistryError::Unknown {
                name: name.to_string(),
                known: ENTRIES.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
            })?;
        if !e.compiled {
            return Err(RegistryError::NotCompiled {
                name: e.name.to_string(),
            });
        }
        if !(e.available)() {
            return Err(RegistryError::Unavailable {
                name: e.name.to_string(),
            });
        }
        chosen.push(e.handle);
    }
    if chosen.is_empty() {
        return Err(RegistryError::Empty);
    }
    chosen.sort_by_key(|h| std::cmp::Reverse(entry(*h).map_or(0, |e| e.priority)));
    chosen.dedup();
    Ok(chosen)
}

/// The fence from `--backend` if given, else from `MINFER_BACKENDS`, else every usable backend.
pub fn fence_from(flag: Option<&str>) -> Result<Vec<Backend>, RegistryError> {
    let env = std::env::var("MINFER_BACKENDS").ok();
    resolve_fence(flag.or(env.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_refusals_are_distinct() {
        assert_eq!(resolve_fence(Some("cpu")), Ok(vec![Backend::CPU]));
        assert!(matches!(resolve_fence(Some("tpu")), Err(RegistryError::Unknown { .. })));
        assert_eq!(
            resolve_fence(Some("cuda")),
            Err(RegistryError::NotCompiled { name: "cuda".into() })
        );
        assert_eq!(
            resolve_fence(Some("metal")),
            Err(RegistryError::NotCompiled { name: "metal".into() })
        );
        assert_eq!(resolve_fence(Some(" , ")), Err(RegistryError::Empty));
        let err = resolve_fence(Some("tpu")).unwrap_err().to_string();
        assert_eq!(err, "unknown backend 'tpu' (known backends: metal, cuda, cpu)");
    }

    #[test]
    fn the_default_fence_is_every_usable_backend_by_priority() {
        assert_eq!(resolve_fence(None), Ok(vec![Backend::CPU]));
    }
}
