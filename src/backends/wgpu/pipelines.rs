//! The WGSL kernels and their compiled pipelines. Each kernel file is one WGSL source; WGSL has
//! no includes, so the shared f16 conversion is prepended to the files that read stored f16,
//! and the weight kernels are compiled once per weight type (a `const TY` prepended), on first
//! use, so a model pays only for the types it holds.
//!
//! Owns the sources and the pipelines; must not dispatch anything.

use crate::quant::GgmlType;
use std::sync::OnceLock;

/// The f16-to-f32 conversion by bit operations, shared by the kernels that read stored f16.
const F16: &str = include_str!("shaders/f16.wgsl");

/// Every kernel file: its name, its WGSL, and whether it reads stored f16.
const KERNELS: [(&str, &str, bool); 7] = [
    ("elementwise", include_str!("shaders/elementwise.wgsl"), false),
    ("rms_norm", include_str!("shaders/rms_norm.wgsl"), false),
    ("rows", include_str!("shaders/rows.wgsl"), false),
    ("rope", include_str!("shaders/rope.wgsl"), false),
    ("weights", include_str!("shaders/weights.wgsl"), true),
    ("kv", include_str!("shaders/kv.wgsl"), true),
    ("attention", include_str!("shaders/attention.wgsl"), true),
];

/// The weight types `weights.wgsl` reads (the backend's `supports_weight`).
pub const WEIGHT_TYPES: [GgmlType; 16] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4,
    ]
};

/// The whole WGSL of kernel file `name`, the shared f16 conversion prepended where it reads f16.
/// `weights` needs a type: see [`weight_source`].
pub(crate) fn kernel_source(name: &str) -> String {
    let (_, source, f16) = KERNELS
        .iter()
        .find(|(n, ..)| *n == name)
        .expect("a kernel file of the table");
    if *f16 {
        format!("{F16}\n{source}")
    } else {
        source.to_string()
    }
}

/// How many tokens the weight kernels multiply at once: the variant appended to `weights.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tokens {
    One,
    Eight,
}

/// The weight kernels' WGSL for weights of type `ty`, in variant `tokens`.
pub(crate) fn weight_source(ty: GgmlType, tokens: Tokens) -> String {
    let variant = match tokens {
        Tokens::One => include_str!("shaders/weights_token.wgsl"),
        Tokens::Eight => include_str!("shaders/weights_tokens8.wgsl"),
    };
    format!(
        "const TY: u32 = {}u;\n{}\n{variant}",
        ty as u32,
        kernel_source("weights")
    )
}

/// The names of every kernel file: for tests that translate them to Metal and HLSL.
#[cfg(test)]
pub(crate) fn kernel_names() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().map(|(name, ..)| *name)
}

fn entry(device: &wgpu::Device, label: &str, source: &str, entry_point: &str) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some(entry_point),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// The kernels of one weight type.
pub(crate) struct WeightKernels {
    /// The matrix-vector product (decode).
    pub(crate) mul_mat: wgpu::ComputePipeline,
    /// The tiled matrix-matrix product (prompts).
    pub(crate) mul_mm: wgpu::ComputePipeline,
    /// One invocation per weight row, for a CPU's lanes: one token (decode).
    pub(crate) mul_mat_rows: wgpu::ComputePipeline,
    /// The same, eight tokens at a time (prompts).
    pub(crate) mul_mat_rows8: wgpu::ComputePipeline,
    /// The row lookup (embeddings).
    pub(crate) get_rows: wgpu::ComputePipeline,
}

/// The compiled kernels, made once per device.
pub(crate) struct Pipelines {
    pub(crate) elementwise: wgpu::ComputePipeline,
    pub(crate) rms_norm: wgpu::ComputePipeline,
    pub(crate) rows: wgpu::ComputePipeline,
    pub(crate) rope: wgpu::ComputePipeline,
    pub(crate) kv_store: wgpu::ComputePipeline,
    pub(crate) attention: wgpu::ComputePipeline,
    /// By the index of the type in [`WEIGHT_TYPES`], compiled on first use.
    weights: [OnceLock<WeightKernels>; WEIGHT_TYPES.len()],
}

impl Pipelines {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let main = |name: &str| entry(device, name, &kernel_source(name), "main");
        Pipelines {
            elementwise: main("elementwise"),
            rms_norm: main("rms_norm"),
            rows: main("rows"),
            rope: main("rope"),
            kv_store: entry(device, "kv_store", &kernel_source("kv"), "kv_store"),
            attention: main("attention"),
            weights: Default::default(),
        }
    }

    /// The kernels of weight type `ty`, compiled now if this is its first use; `None` for a
    /// type `weights.wgsl` does not read.
    pub(crate) fn weights(&self, device: &wgpu::Device, ty: GgmlType) -> Option<&WeightKernels> {
        let index = WEIGHT_TYPES.iter().position(|&t| t == ty)?;
        Some(self.weights[index].get_or_init(|| {
            let source = weight_source(ty, Tokens::One);
            let eight = weight_source(ty, Tokens::Eight);
            WeightKernels {
                mul_mat_rows8: entry(device, &format!("mul_mat_rows8 {ty}"), &eight, "mul_mat_rows"),
                mul_mat: entry(device, &format!("mul_mat {ty}"), &source, "mul_mat"),
                mul_mm: entry(device, &format!("mul_mm {ty}"), &source, "mul_mm"),
                mul_mat_rows: entry(device, &format!("mul_mat_rows {ty}"), &source, "mul_mat_rows"),
                get_rows: entry(device, &format!("get_rows {ty}"), &source, "get_rows"),
            }
        }))
    }
}
