//! The backend registry: every backend minfer knows by name, its fixed id, its assignment
//! priority, whether this build contains it and whether this machine can run it; and the fence
//! (`--backend NAME` / `MINFER_BACKENDS`) that restricts which participate.
//!
//! The refusals are distinct on purpose: an unknown name is a typo, a backend not in this build
//! needs a different build, and one without its driver or its device needs a different machine.
//! Whether a backend is usable here is asked of a probe the caller passes (the backends own
//! their drivers; the graph knows none).

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
}

/// Why a backend this build contains cannot run on this machine, as its probe reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The backend's driver library could not be loaded.
    #[error("no driver: {looked_for} could not be loaded")]
    NoDriver {
        /// The library looked for.
        looked_for: String,
    },
    /// The driver loaded but offers no device.
    #[error("no device: {detail}")]
    NoDevice {
        /// What the driver said.
        detail: String,
    },
    /// The only device is the CPU behind a software driver (Mesa's lavapipe or llvmpipe): used
    /// when a fence names the backend, never joined to a default fence, so that a machine with
    /// Mesa never trades the CPU backend's kernels for a slower software GPU (llama.cpp skips
    /// them the same way).
    #[error("only a software device: {adapter} (name the backend to use it)")]
    SoftwareOnly {
        /// The device's name, as its driver reports it.
        adapter: String,
    },
}

static ENTRIES: [BackendEntry; 4] = [
    BackendEntry {
        handle: Backend::METAL,
        name: "metal",
        priority: 300,
        compiled: false,
    },
    BackendEntry {
        handle: Backend::CUDA,
        name: "cuda",
        priority: 200,
        compiled: cfg!(feature = "cuda"),
    },
    BackendEntry {
        handle: Backend::WGPU,
        name: "wgpu",
        priority: 150,
        compiled: cfg!(feature = "wgpu"),
    },
    BackendEntry {
        handle: Backend::CPU,
        name: "cpu",
        priority: 100,
        compiled: true,
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
    /// The backend is built in but its driver is not on this machine.
    #[error("backend '{name}' is built in but its driver is missing: {looked_for} could not be loaded")]
    NoDriver {
        /// The backend's name.
        name: String,
        /// The library looked for.
        looked_for: String,
    },
    /// The backend and its driver are here but no device is.
    #[error("backend '{name}' is built in and its driver loads, but there is no device: {detail}")]
    NoDevice {
        /// The backend's name.
        name: String,
        /// What the driver said.
        detail: String,
    },
    /// The fence names no backend at all (an empty or blank list).
    #[error("the backend fence is empty")]
    Empty,
}

/// Whether a backend this build contains can run here (`crate::backends::probe`).
pub type Probe<'a> = &'a dyn Fn(Backend) -> Result<(), Unusable>;

/// Resolve a fence: a comma-separated list of backend names, or `None` for every backend this
/// build has and `probe` finds usable. The result is in priority order.
pub fn resolve_fence(names: Option<&str>, probe: Probe<'_>) -> Result<Vec<Backend>, RegistryError> {
    let Some(names) = names else {
        return Ok(ENTRIES
            .iter()
            .filter(|e| e.compiled && probe(e.handle).is_ok())
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
        match probe(e.handle) {
            Ok(()) | Err(Unusable::SoftwareOnly { .. }) => {}
            Err(Unusable::NoDriver { looked_for }) => {
                return Err(RegistryError::NoDriver {
                    name: e.name.to_string(),
                    looked_for,
                })
            }
            Err(Unusable::NoDevice { detail }) => {
                return Err(RegistryError::NoDevice {
                    name: e.name.to_string(),
                    detail,
                })
            }
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
pub fn fence_from(flag: Option<&str>, probe: Probe<'_>) -> Result<Vec<Backend>, RegistryError> {
    let env = std::env::var("MINFER_BACKENDS").ok();
    resolve_fence(flag.or(env.as_deref()), probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_driver(b: Backend) -> Result<(), Unusable> {
        if b == Backend::CPU {
            return Ok(());
        }
        Err(Unusable::NoDriver {
            looked_for: "libcuda.so.1".into(),
        })
    }

    fn no_device(b: Backend) -> Result<(), Unusable> {
        if b == Backend::CPU {
            return Ok(());
        }
        Err(Unusable::NoDevice {
            detail: "the driver reports 0 devices".into(),
        })
    }

    #[test]
    fn the_refusals_are_distinct_and_name_what_was_looked_for() {
        assert_eq!(resolve_fence(Some("cpu"), &no_driver), Ok(vec![Backend::CPU]));
        assert!(matches!(
            resolve_fence(Some("tpu"), &no_driver),
            Err(RegistryError::Unknown { .. })
        ));
        assert_eq!(
            resolve_fence(Some("metal"), &no_driver),
            Err(RegistryError::NotCompiled { name: "metal".into() })
        );
        if cfg!(feature = "cuda") {
            let err = resolve_fence(Some("cuda"), &no_driver).unwrap_err();
            assert_eq!(
                err.to_string(),
                "backend 'cuda' is built in but its driver is missing: libcuda.so.1 could not be loaded"
            );
            let err = resolve_fence(Some("cuda"), &no_device).unwrap_err();
            assert_eq!(
                err.to_string(),
                "backend 'cuda' is built in and its driver loads, but there is no device: the driver reports 0 devices"
            );
        } else {
            assert_eq!(
                resolve_fence(Some("cuda"), &no_driver),
                Err(RegistryError::NotCompiled { name: "cuda".into() })
            );
        }
        assert_eq!(resolve_fence(Some(" , "), &no_driver), Err(RegistryError::Empty));
        let err = resolve_fence(Some("tpu"), &no_driver).unwrap_err().to_string();
        assert_eq!(err, "unknown backend 'tpu' (known backends: metal, cuda, wgpu, cpu)");
    }

    #[test]
    fn the_default_fence_is_every_usable_backend_by_priority() {
        assert_eq!(resolve_fence(None, &no_driver), Ok(vec![Backend::CPU]));
        let everything = |_: Backend| Ok(());
        let built: Vec<Backend> = [Backend::CUDA, Backend::WGPU, Backend::CPU]
            .into_iter()
            .filter(|&b| entry(b).is_some_and(|e| e.compiled))
            .collect();
        assert_eq!(resolve_fence(None, &everything), Ok(built));
        let expected = vec![Backend::CUDA, Backend::CPU];
        assert_eq!(
            resolve_fence(Some("cpu,cuda"), &everything).ok(),
            cfg!(feature = "cuda").then_some(expected)
        );
    }

    #[test]
    fn a_software_only_device_is_used_when_named_and_never_joins_a_default_fence() {
        let software = |b: Backend| match b {
            Backend::CPU => Ok(()),
            Backend::WGPU => Err(Unusable::SoftwareOnly {
                adapter: "llvmpipe".into(),
            }),
            _ => Err(Unusable::NoDriver {
                looked_for: "a driver".into(),
            }),
        };
        assert_eq!(resolve_fence(None, &software), Ok(vec![Backend::CPU]));
        if entry(Backend::WGPU).is_some_and(|e| e.compiled) {
            assert_eq!(
                resolve_fence(Some("wgpu,cpu"), &software),
                Ok(vec![Backend::WGPU, Backend::CPU])
            );
        }
    }
}
