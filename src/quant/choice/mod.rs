//! Which kernel decodes each quantized weight type on this CPU: chosen by measurement, not by
//! feature bits alone.
//!
//! A CPU's feature bits say which kernels it can run, not which runs fastest there: a 512-bit
//! tile tuned on one core can be compute-bound on another, where the 256-bit kernel streams at
//! twice its rate. So at first use, [`choices`] times every candidate of every quantized weight
//! type — the repacked 16-row tiles (`avx512-repacked`), the file-layout dot products with
//! AVX-512 VNNI (`avx512-vnni`) and with AVX2 (`avx2`) — on a slice of a few MiB read from
//! memory as a decoding step reads it (the slice is flushed from the caches before each pass),
//! keeps the fastest, and caches the outcome in the cache directory under the CPU's identity
//! and this binary's, so later starts read it back. The repacked Q4_K and Q6_K tiles' prefetch
//! distance is timed and kept the same way. `MINFER_KERNEL` forces kernels instead.
//! Every candidate is bit-exact with the type's scalar reference, so the choice changes speed
//! only, never a logit.
//!
//! The widest candidate (the one the feature bits pick) is kept unless another is faster by
//! more than [`MARGIN`]: a choice the noise of one measurement would flip is not worth a
//! different layout. Prompts are not timed here: their panel kernels are the instruction set's
//! (`super::gemm`) and read either layout.
//!
//! This module owns the candidates, their timing (the passes in `timing`), the cache (`cache`,
//! with the identities it is keyed by) and the forcing; the type table (`super::traits`) builds
//! its rows from the choice, and the CPU backend repacks the types
//! whose choice is the repacked layout (`super::gemm::repacked_available`). It must hold no
//! arithmetic, and must not read the type table (which is built from it).

mod cache;

pub use cache::{cache_file, cpu_model};
use cache::{read_cache, write_cache, CacheKey, Identity};
#[cfg(test)]
use cache::{CacheEntry, CacheFile, CachedChoice};

use super::simd::{self, Isa};
use super::{repack, traits, GgmlType};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// A kernel that decodes a quantized weight type: an instruction set's dot products on the
/// file's layout, or the repacked layout's 16-row tiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The scalar reference (never measured: forced only).
    #[default]
    Scalar,
    /// The AVX2 dot products on the file's layout.
    Avx2,
    /// The AVX-512 VNNI dot products (256-bit) on the file's layout.
    Avx512Vnni,
    /// The AVX-512 VNNI 16-row tiles on the repacked layout (`super::repack`).
    Repacked,
    /// The NEON dot products on the file's layout (aarch64).
    Neon,
    /// The NEON dot products with the `dotprod` extension's SDOT (aarch64).
    NeonDotprod,
    /// The SDOT dot products, and the prompt's two-by-two tiles on the `i8mm` extension's SMMLA
    /// (aarch64).
    NeonI8mm,
}

impl Kernel {
    /// Every kernel, widest first: the order of the candidates.
    pub const ALL: [Kernel; 7] = [
        Kernel::Repacked,
        Kernel::Avx512Vnni,
        Kernel::Avx2,
        Kernel::NeonI8mm,
        Kernel::NeonDotprod,
        Kernel::Neon,
        Kernel::Scalar,
    ];

    /// The name `MINFER_KERNEL`, the cache and `minfer bench` use.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512Vnni => "avx512-vnni",
            Kernel::Repacked => "avx512-repacked",
            Kernel::Neon => "neon",
            Kernel::NeonDotprod => "neon-dotprod",
            Kernel::NeonI8mm => "neon-i8mm",
        }
    }

    /// The kernel named `name`.
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The instruction set whose table holds the kernel's dot products.
    pub fn isa(self) -> Isa {
        match self {
            Kernel::Scalar => Isa::Scalar,
            Kernel::Avx2 => Isa::Avx2,
            Kernel::Avx512Vnni | Kernel::Repacked => Isa::Avx512,
            Kernel::Neon => Isa::Neon,
            Kernel::NeonDotprod => Isa::Dotprod,
            Kernel::NeonI8mm => Isa::I8mm,
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A bad `MINFER_KERNEL`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChoiceError {
    /// A word that names no kernel.
    #[error(
        "MINFER_KERNEL: {value:?} is not a kernel (scalar, avx2, avx512-vnni, avx512-repacked, neon, \
         neon-dotprod or neon-i8mm, alone or as TYPE=KERNEL; or `measure`, `widest`)"
    )]
    UnknownKernel {
        /// The word.
        value: String,
    },
    /// `TYPE=` with a type that is not a quantized weight type minfer decodes.
    #[error("MINFER_KERNEL: {value:?} is not a quantized weight type minfer computes with")]
    UnknownType {
        /// The type's name as given.
        value: String,
    },
    /// A kernel this CPU, or the `MINFER_NO_*` switches, rule out.
    #[error("MINFER_KERNEL: {kernel} cannot run here (the widest instruction set allowed is {ceiling})")]
    Unsupported {
        /// The kernel asked for.
        kernel: Kernel,
        /// The widest instruction set allowed here.
        ceiling: &'static str,
    },
    /// A kernel the named type has none of.
    #[error("MINFER_KERNEL: {ty} has no {kernel} kernel")]
    NoKernel {
        /// The type named.
        ty: GgmlType,
        /// The kernel asked for it.
        kernel: Kernel,
    },
}

/// What `MINFER_KERNEL` asks for.
#[derive(Debug, Clone, PartialEq)]
enum Spec {
    /// Measure every type (unset, empty or `measure`).
    Measure,
    /// Take the widest candidate of every type, unmeasured (`widest`): the choice of the
    /// feature bits alone.
    Widest,
    /// Force kernels: `KERNEL` for every type (where the type has it), `TYPE=KERNEL` for one;
    /// the types not named are measured.
    Force {
        all: Option<Kernel>,
        types: Vec<(GgmlType, Kernel)>,
    },
}

fn parse_spec(value: &str) -> Result<Spec, ChoiceError> {
    let value = value.trim();
    match value {
        "" | "measure" => return Ok(Spec::Measure),
        "widest" => return Ok(Spec::Widest),
        _ => {}
    }
    let (mut all, mut types) = (None, Vec::new());
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let kernel = |name: &str| {
            Kernel::from_name(name).ok_or_else(|| ChoiceError::UnknownKernel {
                value: name.to_string(),
            })
        };
        match item.split_once('=') {
            None => all = Some(kernel(item)?),
            Some((ty, k)) => {
                let ty = GgmlType::from_name(ty.trim())
                    .filter(|&t| quantized_weight(t))
                    .ok_or_else(|| ChoiceError::UnknownType { value: ty.to_string() })?;
                types.retain(|&(t, _)| t != ty);
                types.push((ty, kernel(k.trim())?));
            }
        }
    }
    Ok(Spec::Force { all, types })
}

/// Whether `ty` is a weight type decoded by block dot products (the types with a choice).
fn quantized_weight(ty: GgmlType) -> bool {
    traits::for_isa(Isa::Scalar)
        .and_then(|rows| traits::row_in(rows, ty))
        .is_some_and(|row| row.block_dots().is_some())
}

/// The candidates for `ty` under the instruction set `ceiling`, widest first: the repacked
/// tiles where the type has a layout and AVX-512 is allowed, then each allowed instruction
/// set's dot products down to AVX2 (the scalar reference only where nothing wider runs).
fn candidates(ty: GgmlType, ceiling: Isa) -> Vec<Kernel> {
    let has_repacked = traits::for_isa(Isa::Avx512)
        .and_then(|rows| traits::row_in(rows, ty))
        .and_then(|row| row.panel())
        .is_some_and(|k| k.has_repacked())
        && repack::supports(ty);
    let mut out: Vec<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|&k| {
            k != Kernel::Scalar
                && k.isa() <= ceiling
                && k.isa().is_supported()
                && (k != Kernel::Repacked || has_repacked)
        })
        .collect();
    if out.is_empty() {
        out.push(Kernel::Scalar);
    }
    out
}

/// Why a type has its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Timed now, on this start.
    Measured,
    /// Timed on an earlier start of this binary on this CPU, and read back from the cache.
    Cached,
    /// `MINFER_KERNEL` named it.
    Forced,
    /// `MINFER_KERNEL=widest`: the feature bits' choice, unmeasured.
    Widest,
    /// The type has one candidate here.
    Only,
    /// The widest candidate, untimed: kernels are timed on x86-64 only (elsewhere the timing
    /// would measure nothing).
    Untimed,
}

/// One quantized weight type's decoding kernel, why, and the figures behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The weight type.
    pub ty: GgmlType,
    /// Its decoding kernel.
    pub kernel: Kernel,
    /// Why that one.
    pub why: Why,
    /// Each candidate's read rate in GB/s on the timed slice, candidates in order (empty when
    /// nothing was timed).
    pub gbps: Vec<(Kernel, f64)>,
    /// How many records ahead the repacked tiles prefetch, where the type's kernel is the
    /// repacked K-quant tile and the distance was timed (else the tile's default, one).
    pub prefetch_records: Option<usize>,
    /// The repacked tile's read rate in GB/s at each distance timed ([`PREFETCH_DISTANCES`]).
    pub prefetch_gbps: Vec<(usize, f64)>,
}

impl Choice {
    /// `avx2 (measured: avx512-repacked 11.2 GB/s, avx512-vnni 20.1, avx2 26.2)`, as `minfer
    /// bench` prints it.
    pub fn describe(&self) -> String {
        let why = match self.why {
            Why::Measured => "measured",
            Why::Cached => "measured on an earlier start",
            Why::Forced => "forced by MINFER_KERNEL",
            Why::Widest => "MINFER_KERNEL=widest",
            Why::Only => "the only candidate",
            Why::Untimed => "the widest: kernels are timed on x86-64 only",
        };
        let figures: Vec<String> = self
            .gbps
            .iter()
            .enumerate()
            .map(|(i, (k, g))| format!("{k} {g:.1}{}", if i == 0 { " GB/s" } else { "" }))
            .collect();
        let mut out = if figures.is_empty() {
            format!("{} ({why})", self.kernel)
        } else {
            format!("{} ({why}: {})", self.kernel, figures.join(", "))
        };
        if let Some(records) = self.prefetch_records {
            let rates: Vec<String> = self.prefetch_gbps.iter().map(|(d, g)| format!("{d} {g:.1}")).collect();
            out += &format!(
                ", prefetching {records} record{} ahead (GB/s by records ahead: {})",
                if records == 1 { "" } else { "s" },
                rates.join(", ")
            );
        }
        out
    }
}

/// The choice for every quantized weight type, and where it came from.
#[derive(Clone, Debug)]
pub struct Choices {
    /// The CPU's identity, as the cache keys it.
    pub cpu: String,
    /// The cache file, when there is one.
    pub cache: Option<PathBuf>,
    /// A `MINFER_KERNEL` that could not be followed (the types were measured instead).
    pub refused: Option<ChoiceError>,
    /// How long the timing took on this start (zero when nothing was timed).
    pub measured_in: Duration,
    choices: Vec<Choice>,
}

impl Choices {
    /// The choice for `ty`, if it is a quantized weight type.
    pub fn get(&self, ty: GgmlType) -> Option<&Choice> {
        self.choices.iter().find(|c| c.ty == ty)
    }

    /// Every choice, in table order.
    pub fn all(&self) -> &[Choice] {
        &self.choices
    }
}

/// The decoding kernel chosen for `ty`, or `None` for a type without a choice (the float
/// types, whose one kernel per instruction set is the table's).
pub fn kernel_of(ty: GgmlType) -> Option<Kernel> {
    choices().get(ty).map(|c| c.kernel)
}

/// The choices, made on the first call: forced by `MINFER_KERNEL`, read from the cache, or
/// measured (and then cached).
pub fn choices() -> &'static Choices {
    static CHOSEN: OnceLock<Choices> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let spec = std::env::var("MINFER_KERNEL").unwrap_or_default();
        let choices = choose(
            simd::isa(),
            &spec,
            cache_file().as_deref(),
            &Identity::here(),
            &mut measure,
        );
        #[cfg(target_arch = "x86_64")]
        for c in &choices.choices {
            if let (Some(records), Some(kind)) = (c.prefetch_records, timing::k_kind(c.ty)) {
                super::simd::x86::gemm_k::set_prefetch_records(kind, records);
            }
        }
        choices
    })
}

/// Checks `MINFER_KERNEL` against this CPU: the binary calls it at start so that a bad value is
/// an error naming it, before anything loads (a library that never calls it gets the types
/// measured instead, and [`Choices::refused`] says why).
pub fn check_env() -> Result<(), ChoiceError> {
    let spec = parse_spec(&std::env::var("MINFER_KERNEL").unwrap_or_default())?;
    forced(&spec, simd::isa()).map(|_| ())
}

/// The kernel `spec` forces for each type under `ceiling` (`None` where it forces none), or
/// the error naming what cannot be.
fn forced(spec: &Spec, ceiling: Isa) -> Result<Vec<(GgmlType, Option<Kernel>)>, ChoiceError> {
    let unsupported = |kernel: Kernel| ChoiceError::Unsupported {
        kernel,
        ceiling: ceiling.name(),
    };
    let types = weight_types();
    let Spec::Force { all, types: named } = spec else {
        return Ok(types.into_iter().map(|t| (t, None)).collect());
    };
    for k in all.iter().chain(named.iter().map(|(_, k)| k)) {
        if *k != Kernel::Scalar && (k.isa() > ceiling || !k.isa().is_supported()) {
            return Err(unsupported(*k));
        }
    }
    types
        .into_iter()
        .map(|ty| {
            let ok = |k: Kernel| k == Kernel::Scalar || candidates(ty, ceiling).contains(&k);
            if let Some(&(_, k)) = named.iter().find(|(t, _)| *t == ty) {
                return if ok(k) {
                    Ok((ty, Some(k)))
                } else {
                    Err(ChoiceError::NoKernel { ty, kernel: k })
                };
            }
            // A kernel for every type applies where the type has it: the repacked tiles fall
            // back to the same instruction set's dot products on types without a layout.
            Ok((ty, all.map(|k| if ok(k) { k } else { Kernel::Avx512Vnni })))
        })
        .collect()
}

/// The quantized weight types, in table order.
fn weight_types() -> Vec<GgmlType> {
    traits::TYPES.iter().copied().filter(|&t| quantized_weight(t)).collect()
}

/// Times each of the kernels decoding a slice of `ty` weights, and the repacked K-quant tile at
/// each prefetch distance ([`PREFETCH_DISTANCES`]; none for the other types): read rates in GB/s.
type Measure<'a> = dyn FnMut(GgmlType, &[Kernel]) -> Rates + 'a;

/// The rates [`Measure`] gives: each kernel's, and each prefetch distance's.
type Rates = (Vec<(Kernel, f64)>, Vec<(usize, f64)>);

/// The choices under `ceiling` for the `MINFER_KERNEL` value `spec`, from the cache `cache`
/// where it holds this identity's, else timed with `measure` (and written back).
fn choose(ceiling: Isa, spec: &str, cache: Option<&Path>, id: &Identity, measure: &mut Measure<'_>) -> Choices {
    let (spec, mut refused) = match parse_spec(spec) {
        Ok(spec) => (spec, None),
        Err(e) => (Spec::Measure, Some(e)),
    };
    let forced = forced(&spec, ceiling).unwrap_or_else(|e| {
        refused = Some(e);
        weight_types().into_iter().map(|t| (t, None)).collect()
    });
    let widest = matches!(spec, Spec::Widest);
    let key = CacheKey {
        cpu: id.cpu.clone(),
        binary: id.binary.clone(),
        ceiling: ceiling.name().to_string(),
    };
    let to_measure: Vec<GgmlType> = forced
        .iter()
        .filter(|(ty, k)| k.is_none() && !widest && CAN_TIME && candidates(*ty, ceiling).len() > 1)
        .map(|(ty, _)| *ty)
        .collect();
    let cached = (!to_measure.is_empty() && id.binary.is_some())
        .then(|| cache.and_then(|path| read_cache(path, &key)))
        .flatten()
        .filter(|entry| to_measure.iter().all(|&ty| entry.choice(ty, ceiling).is_some()));
    let started = std::time::Instant::now();
    let mut measured_any = false;
    let choices = forced
        .into_iter()
        .map(|(ty, forced)| {
            let cands = candidates(ty, ceiling);
            let unmeasured = |kernel, why| Choice {
                ty,
                kernel,
                why,
                gbps: Vec::new(),
                prefetch_records: None,
                prefetch_gbps: Vec::new(),
            };
            if let Some(kernel) = forced {
                return unmeasured(kernel, Why::Forced);
            }
            if cands.len() == 1 || widest || !CAN_TIME {
                let why = if cands.len() == 1 {
                    Why::Only
                } else if widest {
                    Why::Widest
                } else {
                    Why::Untimed
                };
                return unmeasured(cands[0], why);
            }
            if let Some(c) = cached.as_ref().and_then(|entry| entry.choice(ty, ceiling)) {
                return c;
            }
            measured_any = true;
            let (gbps, prefetch_gbps) = measure(ty, &cands);
            let kernel = fastest(&gbps);
            let prefetch_records =
                (kernel == Kernel::Repacked && !prefetch_gbps.is_empty()).then(|| fastest(&prefetch_gbps));
            Choice {
                ty,
                kernel,
                why: Why::Measured,
                gbps,
                prefetch_records,
                prefetch_gbps,
            }
        })
        .collect::<Vec<_>>();
    if measured_any && id.binary.is_some() {
        if let Some(path) = cache {
            write_cache(path, &key, &choices);
        }
    }
    Choices {
        cpu: id.cpu.clone(),
        cache: cache.map(Path::to_path_buf),
        refused,
        measured_in: if measured_any {
            started.elapsed()
        } else {
            Duration::ZERO
        },
        choices,
    }
}

/// Whether this architecture has the kernel timing (`timing`, x86-64 only); elsewhere every type
/// takes its widest candidate.
const CAN_TIME: bool = cfg!(target_arch = "x86_64");

/// How much faster than the widest candidate another must be to be chosen instead.
pub const MARGIN: f64 = 0.25;

/// The option to keep from the rates `gbps` (the default first: the widest kernel, the
/// nearest prefetch distance): the fastest, unless it beats the default by no more than
/// [`MARGIN`].
fn fastest<T: Copy + Default>(gbps: &[(T, f64)]) -> T {
    let Some(&(widest, widest_rate)) = gbps.first() else {
        return T::default();
    };
    let (best, best_rate) = gbps
        .iter()
        .copied()
        .fold((widest, widest_rate), |b, c| if c.1 > b.1 { c } else { b });
    if best_rate > widest_rate * (1.0 + MARGIN) {
        best
    } else {
        widest
    }
}

/// Times each of `kernels` decoding a slice of `ty` weights, as [`choices`] does: the read
/// rate of each in GB/s, on [`SLICE_BYTES`] flushed from the caches.
fn measure(ty: GgmlType, kernels: &[Kernel]) -> Rates {
    let prefetch = if kernels.contains(&Kernel::Repacked) {
        time_prefetch(ty, SLICE_BYTES)
    } else {
        Vec::new()
    };
    (time_kernels(ty, kernels, SLICE_BYTES, true), prefetch)
}

/// The prefetch distances, in records, the repacked K-quant tiles are timed at, the default
/// first.
pub const PREFETCH_DISTANCES: [usize; 4] = [1, 2, 4, 8];

/// Whether `ty`'s repacked tile has a prefetch distance to time (Q4_K, Q6_K).
fn has_prefetch_distance(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// The repacked tile's read rate in GB/s from memory on about `slice_bytes` of `ty` weights at
/// each of [`PREFETCH_DISTANCES`], where `ty` has a repacked K-quant tile on this CPU (else
/// none). It sets the distance the tiles use while it runs, and puts back the one in use.
pub fn time_prefetch(ty: GgmlType, slice_bytes: usize) -> Vec<(usize, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        if !has_prefetch_distance(ty) || !candidates(ty, simd::isa()).contains(&Kernel::Repacked) {
            return Vec::new();
        }
        timing::measure_prefetch(ty, slice_bytes)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, slice_bytes);
        Vec::new()
    }
}

/// The decoding read rate in GB/s of each of `kernels` (each a candidate of `ty` on this CPU:
/// [`candidates_of`]) on about `slice_bytes` of `ty` weights, from memory (`from_memory`: the
/// slice flushed from the caches before each round, as [`choices`] times them) or from
/// whichever caches hold a slice that small (what the kernel computes at most). The kernel
/// micro-benchmark (`cargo bench --bench kernels`) reads both. Zero for a kernel that cannot
/// run here; every rate is zero off x86-64.
pub fn time_kernels(ty: GgmlType, kernels: &[Kernel], slice_bytes: usize, from_memory: bool) -> Vec<(Kernel, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        let ceiling = simd::isa();
        let runnable: Vec<Kernel> = kernels
            .iter()
            .copied()
            .filter(|k| *k == Kernel::Scalar || candidates(ty, ceiling).contains(k))
            .collect();
        let rates = timing::measure(ty, &runnable, slice_bytes, from_memory);
        kernels
            .iter()
            .map(|k| (*k, rates.iter().find(|(r, _)| r == k).map_or(0.0, |(_, g)| *g)))
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, slice_bytes, from_memory);
        kernels.iter().map(|&k| (k, 0.0)).collect()
    }
}

/// The kernels [`choices`] times for `ty` on this CPU under the instruction-set switches,
/// widest first (empty for a type without a choice).
pub fn candidates_of(ty: GgmlType) -> Vec<Kernel> {
    if quantized_weight(ty) {
        candidates(ty, simd::isa())
    } else {
        Vec::new()
    }
}

/// Rounds of passes; each candidate's fastest round counts.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const ROUNDS: usize = 3;

/// Rows a candidate decodes before the next takes its turn (a multiple of the repacked
/// groups): about half a MiB, long enough that a switch costs nothing measurable.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const CHUNK_ROWS: usize = 256;

/// Bytes of weights in a timed slice: past every L2, and a few hundred microseconds a pass.
const SLICE_BYTES: usize = 4 << 20;

/// Values per row of the timed slice (a multiple of every block size).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const SLICE_N_IN: usize = 4096;

#[cfg(target_arch = "x86_64")]
mod timing;

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cpu: &str, binary: &str) -> Identity {
        Identity {
            cpu: cpu.to_string(),
            binary: Some(binary.to_string()),
        }
    }

    /// A measurement that counts its calls and makes the last candidate twice as fast as the
    /// others, and (for Q4_K and Q6_K with a repacked tile) four records ahead the fastest
    /// prefetch.
    fn counting(calls: &mut usize) -> impl FnMut(GgmlType, &[Kernel]) -> Rates + '_ {
        |ty, kernels| {
            *calls += 1;
            let last = kernels.len() - 1;
            let gbps = kernels
                .iter()
                .enumerate()
                .map(|(i, &k)| (k, if i == last { 20.0 } else { 10.0 }))
                .collect();
            let prefetch = if has_prefetch_distance(ty) && kernels.contains(&Kernel::Repacked) {
                PREFETCH_DISTANCES
                    .iter()
                    .map(|&d| (d, if d == 4 { 30.0 } else { 10.0 }))
                    .collect()
            } else {
                Vec::new()
            };
            (gbps, prefetch)
        }
    }

    /// A measurement that makes the repacked tiles the fastest kernel.
    fn repacked_fastest(ty: GgmlType, kernels: &[Kernel]) -> Rates {
        let mut none = 0;
        let (_, prefetch) = counting(&mut none)(ty, kernels);
        let gbps = kernels
            .iter()
            .map(|&k| (k, if k == Kernel::Repacked { 20.0 } else { 10.0 }))
            .collect();
        (gbps, prefetch)
    }

    #[test]
    fn a_repacked_k_quant_tile_gets_the_prefetch_distance_measured_fastest_and_keeps_it_in_the_cache() {
        let ceiling = simd::isa();
        if !candidates(GgmlType::Q4_K, ceiling).contains(&Kernel::Repacked) {
            eprintln!("choice: no repacked Q4_K tile on this CPU");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("kernels.json");
        let here = id("cpu", "bin");
        let first = choose(ceiling, "", Some(&cache), &here, &mut repacked_fastest);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let c = first.get(ty).unwrap();
            assert_eq!((c.kernel, c.prefetch_records), (Kernel::Repacked, Some(4)), "{ty}");
            assert!(c
                .describe()
                .ends_with("prefetching 4 records ahead (GB/s by records ahead: 1 10.0, 2 10.0, 4 30.0, 8 10.0)"));
        }
        // A type without the tile has no distance.
        assert_eq!(first.get(GgmlType::Q8_0).unwrap().prefetch_records, None);
        let mut calls = 0;
        let second = choose(ceiling, "", Some(&cache), &here, &mut counting(&mut calls));
        assert_eq!(calls, 0);
        assert_eq!(second.get(GgmlType::Q6_K).unwrap().prefetch_records, Some(4));
        // Forcing the kernel leaves the tile's default distance.
        let forced = choose(ceiling, "avx512-repacked", None, &here, &mut repacked_fastest);
        assert_eq!(forced.get(GgmlType::Q4_K).unwrap().prefetch_records, None);
    }

    /// The instruction sets this CPU runs with more than one candidate for some type.
    fn tunable() -> Option<Isa> {
        let isa = simd::isa();
        if !CAN_TIME {
            return None;
        }
        weight_types()
            .iter()
            .any(|&t| candidates(t, isa).len() > 1)
            .then_some(isa)
    }

    #[test]
    fn a_cached_choice_is_read_back_and_invalidated_by_another_cpu_model_binary_or_ceiling() {
        let Some(ceiling) = tunable() else {
            eprintln!("choice: nothing to choose between on this CPU");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("kernels.json");
        let here = id(
            "GenuineIntel family 6 model 143 stepping 8 (Xeon)",
            "minfer 0.1.0 1 bytes 1.0",
        );
        let mut calls = 0;
        let first = choose(ceiling, "", Some(&cache), &here, &mut counting(&mut calls));
        assert!(calls > 0 && !first.measured_in.is_zero());
        let measured: Vec<&Choice> = first.all().iter().filter(|c| c.why == Why::Measured).collect();
        assert_eq!(measured.len(), calls);
        // The measurement made the last candidate twice as fast: it is chosen.
        for c in &measured {
            assert_eq!(c.kernel, *candidates(c.ty, ceiling).last().unwrap(), "{}", c.ty);
        }

        let mut again = 0;
        let second = choose(ceiling, "", Some(&cache), &here, &mut counting(&mut again));
        assert_eq!(again, 0, "the same CPU and binary read the cache");
        for (a, b) in first.all().iter().zip(second.all()) {
            assert_eq!((a.ty, a.kernel, &a.gbps), (b.ty, b.kernel, &b.gbps));
            assert_eq!(b.why, if a.why == Why::Measured { Why::Cached } else { a.why });
        }

        for other in [
            id(
                "AuthenticAMD family 25 model 17 stepping 1 (EPYC)",
                "minfer 0.1.0 1 bytes 1.0",
            ),
            id(
                "GenuineIntel family 6 model 143 stepping 8 (Xeon)",
                "minfer 0.1.0 2 bytes 7.0",
            ),
        ] {
            let mut n = 0;
            let c = choose(ceiling, "", Some(&cache), &other, &mut counting(&mut n));
            assert_eq!(n, calls, "{other:?} measures again");
            assert!(c.all().iter().any(|c| c.why == Why::Measured));
        }
        // Both identities are cached side by side now, and the first is still there.
        let mut n = 0;
        choose(ceiling, "", Some(&cache), &here, &mut counting(&mut n));
        assert_eq!(n, 0);
        if ceiling > Isa::Avx2 {
            // Under MINFER_NO_AVX512 the AVX2 dot products are the one candidate: nothing is
            // timed, and the cached AVX-512 choices are not taken.
            let mut n = 0;
            let c = choose(Isa::Avx2, "", Some(&cache), &here, &mut counting(&mut n));
            assert_eq!(n, 0);
            assert!(c.all().iter().all(|c| (c.kernel, c.why) == (Kernel::Avx2, Why::Only)));
        }
    }

    #[test]
    fn a_binary_that_cannot_be_identified_measures_and_caches_nothing() {
        let Some(ceiling) = tunable() else { return };
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("kernels.json");
        let anonymous = Identity {
            cpu: "cpu".into(),
            binary: None,
        };
        let mut calls = 0;
        choose(ceiling, "", Some(&cache), &anonymous, &mut counting(&mut calls));
        assert!(calls > 0);
        assert!(!cache.exists());
    }

    #[test]
    fn a_hostile_cache_file_is_measured_over_never_trusted() {
        let Some(ceiling) = tunable() else { return };
        let dir = tempfile::tempdir().unwrap();
        let here = id("cpu", "bin");
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, b"{\"entries\": [{\"key\": 3").unwrap();
        let wrong_kernel = dir.path().join("wrong.json");
        let key = CacheKey {
            cpu: "cpu".into(),
            binary: Some("bin".into()),
            ceiling: ceiling.name().into(),
        };
        let entry = CacheFile {
            entries: vec![CacheEntry {
                key,
                choices: weight_types()
                    .iter()
                    .map(|t| CachedChoice {
                        ty: t.name().into(),
                        kernel: "avx1024".into(),
                        gbps: Vec::new(),
                        prefetch_records: Some(1 << 40),
                        prefetch_gbps: Vec::new(),
                    })
                    .collect(),
            }],
        };
        std::fs::write(&wrong_kernel, serde_json::to_vec(&entry).unwrap()).unwrap();
        let directory = dir.path().join("a-directory");
        std::fs::create_dir(&directory).unwrap();
        for path in [&garbage, &wrong_kernel, &directory] {
            let mut calls = 0;
            let c = choose(ceiling, "", Some(path), &here, &mut counting(&mut calls));
            assert!(calls > 0, "{}", path.display());
            assert!(c.all().iter().all(|c| c.why != Why::Cached));
        }
        // The malformed files were replaced by good ones.
        let mut calls = 0;
        choose(ceiling, "", Some(&garbage), &here, &mut counting(&mut calls));
        assert_eq!(calls, 0);
    }

    #[test]
    fn another_kernel_replaces_the_widest_only_when_it_is_faster_by_the_margin() {
        use Kernel::*;
        assert_eq!(fastest(&[(Repacked, 10.0), (Avx512Vnni, 12.0), (Avx2, 12.4)]), Repacked);
        assert_eq!(fastest(&[(Repacked, 11.2), (Avx512Vnni, 20.1), (Avx2, 26.2)]), Avx2);
        assert_eq!(
            fastest(&[(Repacked, 0.0), (Avx2, 1.0)]),
            Avx2,
            "a kernel that did not run"
        );
        assert_eq!(fastest(&[(Avx2, 5.0)]), Avx2);
    }

    #[test]
    fn minfer_kernel_forces_kernels_by_name_and_refuses_what_it_cannot_name_or_run() {
        assert_eq!(parse_spec("").unwrap(), Spec::Measure);
        assert_eq!(parse_spec(" measure ").unwrap(), Spec::Measure);
        assert_eq!(parse_spec("widest").unwrap(), Spec::Widest);
        assert_eq!(
            parse_spec("avx2, Q6_K=scalar,Q6_K=avx2").unwrap(),
            Spec::Force {
                all: Some(Kernel::Avx2),
                types: vec![(GgmlType::Q6_K, Kernel::Avx2)],
            }
        );
        let err = |v: &str| parse_spec(v).err().unwrap().to_string();
        assert!(
            err("avx1024").contains("\"avx1024\" is not a kernel"),
            "{}",
            err("avx1024")
        );
        assert!(err("Q4_K=fast").contains("\"fast\" is not a kernel"));
        assert!(err("Q9_X=avx2").contains("\"Q9_X\" is not a quantized weight type"));
        assert!(err("F16=avx2").contains("\"F16\""), "the float types have no choice");
        assert!(
            err("Q8_K=avx2").contains("\"Q8_K\""),
            "activation-only types have no choice"
        );

        // Every kernel names one of the instruction sets, and none runs above the ceiling.
        let all = |k| Spec::Force {
            all: Some(k),
            types: Vec::new(),
        };
        let unsupported = forced(&all(Kernel::Avx512Vnni), Isa::Avx2).err().unwrap();
        assert_eq!(
            unsupported.to_string(),
            "MINFER_KERNEL: avx512-vnni cannot run here (the widest instruction set allowed is avx2)"
        );
        let scalar = forced(&all(Kernel::Scalar), Isa::Scalar).unwrap();
        assert!(scalar.iter().all(|(_, k)| *k == Some(Kernel::Scalar)));
        let ceiling = simd::isa();
        if ceiling == Isa::Avx512 && candidates(GgmlType::Q4_K, ceiling).contains(&Kernel::Repacked) {
            // A kernel for every type falls back to the same instruction set's dot products
            // where a type has no repacked layout; named for that type, it is refused.
            let every = forced(&all(Kernel::Repacked), ceiling).unwrap();
            let of = |ty| every.iter().find(|(t, _)| *t == ty).unwrap().1;
            assert_eq!(of(GgmlType::Q4_K), Some(Kernel::Repacked));
            assert_eq!(of(GgmlType::Q5_K), Some(Kernel::Avx512Vnni));
            let named = Spec::Force {
                all: None,
                types: vec![(GgmlType::Q5_K, Kernel::Repacked)],
            };
            assert_eq!(
                forced(&named, ceiling).err().unwrap().to_string(),
                "MINFER_KERNEL: Q5_K has no avx512-repacked kernel"
            );
        }
    }

    #[test]
    fn forced_and_widest_choices_time_nothing_and_a_bad_value_is_measured_over_and_reported() {
        let ceiling = simd::isa();
        let here = id("cpu", "bin");
        let mut calls = 0;
        let c = choose(ceiling, "avx2", None, &here, &mut counting(&mut calls));
        if matches!(ceiling, Isa::Avx2 | Isa::Avx512) {
            assert_eq!(calls, 0);
            assert!(c.all().iter().all(|c| c.kernel == Kernel::Avx2 && c.why == Why::Forced));
            assert_eq!(
                c.get(GgmlType::Q6_K).unwrap().describe(),
                "avx2 (forced by MINFER_KERNEL)"
            );
        }
        if matches!(ceiling, Isa::Dotprod | Isa::I8mm) {
            // aarch64 with dotprod: the baseline NEON kernels can be forced; an x86 kernel cannot
            // run here; unforced, the widest (SDOT, or SDOT with SMMLA) are taken untimed.
            let mut calls = 0;
            let c = choose(ceiling, "neon", None, &here, &mut counting(&mut calls));
            assert_eq!(calls, 0);
            assert!(c.all().iter().all(|c| c.kernel == Kernel::Neon && c.why == Why::Forced));
            let c = choose(ceiling, "avx2", None, &here, &mut counting(&mut calls));
            assert_eq!(
                c.refused.unwrap().to_string(),
                format!(
                    "MINFER_KERNEL: avx2 cannot run here (the widest instruction set allowed is {})",
                    ceiling.name()
                )
            );
            let widest = if ceiling == Isa::I8mm {
                Kernel::NeonI8mm
            } else {
                Kernel::NeonDotprod
            };
            let c = choose(ceiling, "", None, &here, &mut counting(&mut calls));
            assert_eq!(calls, 0);
            assert!(c.all().iter().all(|c| c.kernel == widest && c.why == Why::Untimed));
        }
        let mut calls = 0;
        let c = choose(ceiling, "widest", None, &here, &mut counting(&mut calls));
        assert_eq!(calls, 0);
        for choice in c.all() {
            assert_eq!(choice.kernel, candidates(choice.ty, ceiling)[0]);
        }
        let mut calls = 0;
        let c = choose(ceiling, "Q4_K=avx1024", None, &here, &mut counting(&mut calls));
        assert!(matches!(c.refused, Some(ChoiceError::UnknownKernel { .. })));
        assert_eq!(calls > 0, tunable().is_some());
    }

    #[test]
    fn the_description_names_the_choice_the_reason_and_every_candidates_rate() {
        let c = Choice {
            ty: GgmlType::Q6_K,
            kernel: Kernel::Avx2,
            why: Why::Measured,
            gbps: vec![
                (Kernel::Repacked, 11.24),
                (Kernel::Avx512Vnni, 20.1),
                (Kernel::Avx2, 26.2),
            ],
            prefetch_records: None,
            prefetch_gbps: Vec::new(),
        };
        assert_eq!(
            c.describe(),
            "avx2 (measured: avx512-repacked 11.2 GB/s, avx512-vnni 20.1, avx2 26.2)"
        );
    }

    #[test]
    fn the_timing_gives_every_candidate_a_rate_and_cannot_run_what_the_cpu_lacks() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let kernels = candidates_of(ty);
            let rates = time_kernels(ty, &kernels, 1 << 18, false);
            assert_eq!(rates.iter().map(|r| r.0).collect::<Vec<_>>(), kernels);
            if cfg!(target_arch = "x86_64") {
                assert!(rates.iter().all(|r| r.1 > 0.0), "{ty}: {rates:?}");
            }
        }
        if simd::isa() < Isa::Avx512 {
            let rates = time_kernels(GgmlType::Q4_K, &[Kernel::Repacked], 1 << 18, false);
            assert_eq!(rates, [(Kernel::Repacked, 0.0)]);
        }
    }
}
