//! llama.cpp's file types (`llama_ftype`): what `general.file_type` says of a quantized file,
//! the names llama-quantize takes for them and the type each one starts every matrix from.

use crate::quant::GgmlType;

/// A file type `quantize` writes, with its `llama_ftype` id as the discriminant.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FileType {
    /// Every tensor in F32 (`LLAMA_FTYPE_ALL_F32`).
    F32 = 0,
    /// Matrices in F16.
    F16 = 1,
    /// Matrices in Q4_0, the output in Q6_K.
    Q4_0 = 2,
    /// Matrices in Q4_1, the output in Q6_K.
    Q4_1 = 3,
    /// Matrices in Q8_0.
    Q8_0 = 7,
    /// Matrices in Q5_0, the output in Q6_K.
    Q5_0 = 8,
    /// Matrices in Q5_1, the output in Q6_K.
    Q5_1 = 9,
    /// Q2_K, the attention values, attention outputs and feed-forward outputs in Q3_K (values
    /// in Q4_K with grouped-query attention of 4 or more).
    Q2_K = 10,
    /// Matrices in Q3_K.
    Q3_K_S = 11,
    /// Q2_K made with an importance matrix (which it needs), the attention values in Q4_K with
    /// grouped-query attention of 4 or more and the first eighth of the feed-forward outputs
    /// in Q4_K.
    Q2_K_S = 21,
    /// Q3_K, the first two attention values and the first sixteenth of the feed-forward
    /// outputs in Q5_K, the other values, outputs and attention outputs in Q4_K.
    Q3_K_M = 12,
    /// Q3_K, the attention values, attention outputs and feed-forward outputs in Q5_K.
    Q3_K_L = 13,
    /// Q4_K, the first attention values and feed-forward outputs in Q5_K.
    Q4_K_S = 14,
    /// Q4_K, half the attention values and feed-forward outputs in Q6_K.
    Q4_K_M = 15,
    /// Q5_K, the output in Q6_K.
    Q5_K_S = 16,
    /// Q5_K, half the attention values and feed-forward outputs in Q6_K.
    Q5_K_M = 17,
    /// Matrices in Q6_K.
    Q6_K = 18,
    /// IQ4_NL, the first eighth of the feed-forward outputs in Q5_K (and the attention values
    /// with grouped-query attention of 4 or more).
    IQ4_NL = 25,
    /// IQ4_XS, with IQ4_NL's exceptions.
    IQ4_XS = 30,
    /// Matrices in BF16.
    BF16 = 32,
    /// Ternary TQ1_0 matrices, an untied embedding in Q4_K.
    TQ1_0 = 36,
    /// Ternary TQ2_0 matrices, an untied embedding in Q4_K.
    TQ2_0 = 37,
}

/// llama-quantize's names (its `QUANT_OPTIONS`), aliases included, for the types we write.
const NAMES: &[(&str, FileType)] = &[
    ("Q4_0", FileType::Q4_0),
    ("Q4_1", FileType::Q4_1),
    ("Q5_0", FileType::Q5_0),
    ("Q5_1", FileType::Q5_1),
    ("Q2_K", FileType::Q2_K),
    ("Q2_K_S", FileType::Q2_K_S),
    ("Q3_K", FileType::Q3_K_M),
    ("Q3_K_S", FileType::Q3_K_S),
    ("Q3_K_M", FileType::Q3_K_M),
    ("Q3_K_L", FileType::Q3_K_L),
    ("Q4_K", FileType::Q4_K_M),
    ("Q4_K_S", FileType::Q4_K_S),
    ("Q4_K_M", FileType::Q4_K_M),
    ("Q5_K", FileType::Q5_K_M),
    ("Q5_K_S", FileType::Q5_K_S),
    ("Q5_K_M", FileType::Q5_K_M),
    ("IQ4_NL", FileType::IQ4_NL),
    ("IQ4_XS", FileType::IQ4_XS),
    ("TQ1_0", FileType::TQ1_0),
    ("TQ2_0", FileType::TQ2_0),
    ("Q6_K", FileType::Q6_K),
    ("Q8_0", FileType::Q8_0),
    ("F16", FileType::F16),
    ("BF16", FileType::BF16),
    ("F32", FileType::F32),
];

/// Every `llama_ftype` minfer names: its `general.file_type` value and llama.cpp's name for it
/// (`llama_model_ftype_name`, what `minfer info` and `bench` print). The one table of file-type
/// names: each mix `minfer quantize` writes is found in it by its value ([`FileType::id`]).
const LLAMA_FTYPES: &[(u64, &str)] = &[
    (0, "all F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K - Medium"),
    (11, "Q3_K - Small"),
    (12, "Q3_K - Medium"),
    (13, "Q3_K - Large"),
    (14, "Q4_K - Small"),
    (15, "Q4_K - Medium"),
    (16, "Q5_K - Small"),
    (17, "Q5_K - Medium"),
    (18, "Q6_K"),
    (19, "IQ2_XXS - 2.0625 bpw"),
    (20, "IQ2_XS - 2.3125 bpw"),
    (21, "Q2_K - Small"),
    (22, "IQ3_XS - 3.3 bpw"),
    (23, "IQ3_XXS - 3.0625 bpw"),
    (24, "IQ1_S - 1.5625 bpw"),
    (25, "IQ4_NL - 4.5 bpw"),
    (26, "IQ3_S - 3.4375 bpw"),
    (27, "IQ3_S mix - 3.66 bpw"),
    (28, "IQ2_S - 2.5 bpw"),
    (29, "IQ2_M - 2.7 bpw"),
    (30, "IQ4_XS - 4.25 bpw"),
    (31, "IQ1_M - 1.75 bpw"),
    (32, "BF16"),
    (36, "TQ1_0 - 1.69 bpw ternary"),
    (37, "TQ2_0 - 2.06 bpw ternary"),
    (38, "MXFP4 MoE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

/// llama.cpp's name for the `general.file_type` value `id` (`llama_model_ftype_name`), or
/// `"unknown"`.
pub fn llama_ftype_name(id: u64) -> &'static str {
    LLAMA_FTYPES
        .iter()
        .find(|(i, _)| *i == id)
        .map_or("unknown", |(_, name)| name)
}

impl FileType {
    /// The file type llama-quantize means by `name` (any case; `Q3_K`, `Q4_K` and `Q5_K` are
    /// its aliases for `Q3_K_M`, `Q4_K_M` and `Q5_K_M`), or `None` for a type we do not write.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, t)| t)
    }

    /// The names [`FileType::from_name`] takes, for messages.
    pub fn names() -> impl Iterator<Item = &'static str> {
        NAMES.iter().map(|(n, _)| *n)
    }

    /// The canonical name (`Q4_K_M`, never its alias).
    pub fn name(self) -> &'static str {
        match self {
            FileType::Q3_K_M => "Q3_K_M",
            FileType::Q4_K_M => "Q4_K_M",
            FileType::Q5_K_M => "Q5_K_M",
            t => NAMES.iter().find(|&&(_, f)| f == t).map(|(n, _)| *n).unwrap_or("?"),
        }
    }

    /// The `general.file_type` value (`llama_ftype`).
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Whether its matrices of `ty` need an importance matrix (`tensor_requires_imatrix`): the
    /// Q2_K ones of a Q2_K_S file.
    pub fn needs_imatrix(self, ty: GgmlType) -> bool {
        self == FileType::Q2_K_S && ty == GgmlType::Q2_K
    }

    /// The type every matrix starts from before the mix's rules (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            FileType::F32 => GgmlType::F32,
            FileType::F16 => GgmlType::F16,
            FileType::BF16 => GgmlType::BF16,
            FileType::Q4_0 => GgmlType::Q4_0,
            FileType::Q4_1 => GgmlType::Q4_1,
            FileType::Q5_0 => GgmlType::Q5_0,
            FileType::Q5_1 => GgmlType::Q5_1,
            FileType::Q8_0 => GgmlType::Q8_0,
            FileType::Q2_K | FileType::Q2_K_S => GgmlType::Q2_K,
            FileType::Q3_K_S | FileType::Q3_K_M | FileType::Q3_K_L => GgmlType::Q3_K,
            FileType::Q4_K_S | FileType::Q4_K_M => GgmlType::Q4_K,
            FileType::Q5_K_S | FileType::Q5_K_M => GgmlType::Q5_K,
            FileType::Q6_K => GgmlType::Q6_K,
            FileType::IQ4_NL => GgmlType::IQ4_NL,
            FileType::IQ4_XS => GgmlType::IQ4_XS,
            FileType::TQ1_0 => GgmlType::TQ1_0,
            FileType::TQ2_0 => GgmlType::TQ2_0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mix_we_write_is_in_the_one_table_under_its_own_value() {
        for name in FileType::names() {
            let t = FileType::from_name(name).unwrap();
            assert_ne!(llama_ftype_name(u64::from(t.id())), "unknown", "{name}");
        }
        assert_eq!(llama_ftype_name(u64::from(FileType::Q4_K_S.id())), "Q4_K - Small");
        assert_eq!(llama_ftype_name(15), "Q4_K - Medium");
        assert_eq!(llama_ftype_name(0), "all F32");
        assert_eq!(llama_ftype_name(11), "Q3_K - Small");
        assert_eq!(llama_ftype_name(99), "unknown");
    }

    #[test]
    fn names_parse_in_any_case_and_aliases_name_the_medium_mixes() {
        assert_eq!(FileType::from_name("q4_k_m"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::from_name("Q4_K"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::from_name("Q5_K"), Some(FileType::Q5_K_M));
        assert_eq!(FileType::from_name("Q3_K"), Some(FileType::Q3_K_M));
        assert_eq!(FileType::from_name("q2_k_s"), Some(FileType::Q2_K_S));
        assert_eq!(FileType::Q3_K_M.name(), "Q3_K_M");
        assert_eq!(FileType::Q4_K_M.name(), "Q4_K_M");
        assert_eq!(FileType::Q5_K_M.name(), "Q5_K_M");
        for name in FileType::names() {
            let t = FileType::from_name(name).unwrap();
            assert_eq!(FileType::from_name(t.name()), Some(t), "{name}");
        }
    }
}
