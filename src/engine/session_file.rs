//! Saved sessions (llama.cpp's `--prompt-cache`): the tokens of sequence 0 and their K and V
//! rows, written to a file so that a later run whose prompt shares a prefix prefills only the
//! rest.
//!
//! The file is a fixed header, then the payload:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `MINFSESS` |
//! | 4 | format version ([`VERSION`]) |
//! | 8 | model identity: a hash of the model's tensor table and file size |
//! | 4 | KV cache types: K's ggml type id in the low 16 bits, V's in the high 16 |
//! | 4, 4 | n_layer, n_kv_embd |
//! | 4 | n_ctx of the session that saved it |
//! | 4 | token count |
//! | 8 | FNV-1a hash of the payload |
//! | ... | payload: the tokens (u32 each), then per layer the K rows and the V rows, as stored |
//!
//! All little-endian. A file is checked whole before anything is touched: every refusal
//! ([`SessionFileError`]) names the check that failed, and a refused file leaves the session
//! as it was. Only a regular file is read (a FIFO or a device is refused, never waited on), and
//! every K and V value (every Q8_0 block's scale) must be finite: a checksum proves only that
//! the bytes are the ones written. Writing goes to a new temporary file beside the target
//! (created exclusively, never through a planted link), renamed over it once complete, so a
//! crash mid-save leaves the previous file intact; a target that is not a regular file is
//! refused, not replaced.

use super::{EngineError, Model, Session};
use crate::graph::DType;
use std::io::Write;
use std::path::Path;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"MINFSESS";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 8 + 4 + 4 + 4 + 4 + 4 + 8;

/// The id a KV type has in the header (ggml's type ids): f32 0, f16 1, q8_0 8.
fn type_id(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q8_0 => 8,
        DType::I32 => 26,
    }
}

/// The name of a header type id, for messages.
fn type_name(id: u32) -> String {
    match id {
        0 => "f32".into(),
        1 => "f16".into(),
        8 => "q8_0".into(),
        other => format!("unknown type {other}"),
    }
}

/// The header's KV type field: K's id in the low half, V's in the high half.
fn kv_field(type_k: DType, type_v: DType) -> u32 {
    type_id(type_k) | type_id(type_v) << 16
}

/// Why a session file was not written or not loaded.
#[derive(Debug, thiserror::Error)]
pub enum SessionFileError {
    /// The file could not be read or written.
    #[error("session file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A check failed; `check` says which, `path` which file.
    #[error("session file {path} refused: {check}")]
    Refused {
        /// The file.
        path: String,
        /// The failed check, with the values compared.
        check: String,
    },
    /// Reading or writing the cache failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The model's identity as a session file records it: a hash of its tensor table (names,
/// types, shapes, offsets) and its size on disk. Another model, or another quantization of the
/// same one, has another identity.
pub fn model_identity(model: &Model) -> u64 {
    let mut h = Fnv::new();
    h.write(&model.file().file_size().to_le_bytes());
    for t in model.file().tensors() {
        h.write(t.name.as_bytes());
        h.write(format!("{:?}", t.ggml_type).as_bytes());
        for d in &t.shape {
            h.write(&d.to_le_bytes());
        }
        h.write(&t.offset.to_le_bytes());
    }
    h.finish()
}

/// Save sequence 0 of `session` (its tokens, and their K and V rows) to `path`, atomically.
/// Returns the number of tokens saved.
pub fn save(session: &mut Session, model: &Model, path: &Path) -> Result<usize, SessionFileError> {
    let (tokens, layers) = session.export_state()?;
    let hp = model.hparams();
    let (type_k, type_v) = session.kv_types();
    let mut payload =
        Vec::with_capacity(tokens.len() * 4 + layers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    for &t in &tokens {
        payload.extend_from_slice(&t.to_le_bytes());
    }
    for (k, v) in &layers {
        payload.extend_from_slice(k);
        payload.extend_from_slice(v);
    }
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&model_identity(model).to_le_bytes());
    header.extend_from_slice(&kv_field(type_k, type_v).to_le_bytes());
    header.extend_from_slice(&(hp.n_layer as u32).to_le_bytes());
    header.extend_from_slice(&(hp.n_kv_embd() as u32).to_le_bytes());
    header.extend_from_slice(&(session.n_ctx() as u32).to_le_bytes());
    header.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    let mut h = Fnv::new();
    h.write(&payload);
    header.extend_from_slice(&h.finish().to_le_bytes());
    write_atomic(path, |file| {
        file.write_all(&header)?;
        file.write_all(&payload)
    })?;
    Ok(tokens.len())
}

/// Load `path` into `session` (replacing what sequence 0 holds) after checking it whole;
/// returns the tokens it holds. A refused file changes nothing.
pub fn load(session: &mut Session, model: &Model, path: &Path) -> Result<Vec<u32>, SessionFileError> {
    let name = path.display().to_string();
    let io = |source| SessionFileError::Io {
        path: name.clone(),
        source,
    };
    let refuse = |check: String| SessionFileError::Refused {
        path: name.clone(),
        check,
    };
    // Opened without blocking, then checked: a FIFO given here would otherwise wait forever
    // for a writer.
    let mut file = crate::fs_safe::open_nonblocking(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(refuse(format!(
            "it is {}, not a regular file",
            crate::fs_safe::describe(meta.file_type())
        )));
    }
    let len = meta.len();
    if len < HEADER_BYTES as u64 {
        return Err(refuse(format!(
            "truncated: {len} bytes, shorter than the {HEADER_BYTES}-byte header"
        )));
    }
    let mut header = [0u8; HEADER_BYTES];
    std::io::Read::read_exact(&mut file, &mut header).map_err(io)?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if &header[..8] != MAGIC {
        return Err(refuse("not a minfer session file (bad magic)".into()));
    }
    let version = u32_at(8);
    if version != VERSION {
        return Err(refuse(format!(
            "format version {version}, this build reads version {VERSION}"
        )));
    }
    let identity = u64_at(12);
    if identity != model_identity(model) {
        return Err(refuse(format!(
            "it was saved with another model (identity {identity:016x}, this model's is {:016x})",
            model_identity(model)
        )));
    }
    let kv_type = u32_at(20);
    let (type_k, type_v) = session.kv_types();
    if kv_type != kv_field(type_k, type_v) {
        return Err(refuse(format!(
            "its KV cache stores K as {} and V as {}, this session K as {} and V as {}",
            type_name(kv_type & 0xffff),
            type_name(kv_type >> 16),
            type_k.name(),
            type_v.name()
        )));
    }
    let hp = model.hparams();
    let (n_layer, n_kv_embd) = (u32_at(24) as usize, u32_at(28) as usize);
    if (n_layer, n_kv_embd) != (hp.n_layer, hp.n_kv_embd()) {
        return Err(refuse(format!(
            "its cache has {n_layer} layers of {n_kv_embd} values per token, this model's {} of {}",
            hp.n_layer,
            hp.n_kv_embd()
        )));
    }
    let n_tokens = u32_at(36) as usize;
    if n_tokens > session.n_ctx() {
        return Err(refuse(format!(
            "it holds {n_tokens} tokens, more than this session's context of {} (it was saved with n_ctx {})",
            session.n_ctx(),
            u32_at(32)
        )));
    }
    // Bounded by n_ctx above, so this cannot overflow or ask for more than a cache holds.
    let (k_bytes, v_bytes) = (type_k.bytes(n_tokens * n_kv_embd), type_v.bytes(n_tokens * n_kv_embd));
    let payload_len = n_tokens * 4 + n_layer * (k_bytes + v_bytes);
    if len != (HEADER_BYTES + payload_len) as u64 {
        return Err(refuse(format!(
            "{len} bytes where a header saying {n_tokens} tokens needs {}: truncated or extended",
            HEADER_BYTES + payload_len
        )));
    }
    let mut payload = vec![0u8; payload_len];
    std::io::Read::read_exact(&mut file, &mut payload).map_err(io)?;
    let mut h = Fnv::new();
    h.write(&payload);
    if h.finish() != u64_at(40) {
        return Err(refuse(
            "the payload's checksum does not match: the file is corrupted".into(),
        ));
    }
    let (token_bytes, rows) = payload.split_at(n_tokens * 4);
    let tokens: Vec<u32> = token_bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= hp.n_vocab) {
        return Err(refuse(format!(
            "token {bad} is outside the vocabulary of {}",
            hp.n_vocab
        )));
    }
    let layers: Vec<(&[u8], &[u8])> = (0..n_layer)
        .map(|l| {
            let at = l * (k_bytes + v_bytes);
            (&rows[at..at + k_bytes], &rows[at + k_bytes..at + k_bytes + v_bytes])
        })
        .collect();
    for (layer, (k, v)) in layers.iter().enumerate() {
        for (which, dtype, bytes) in [("K", type_k, k), ("V", type_v, v)] {
            if let Some(at) = first_non_finite(dtype, bytes) {
                return Err(refuse(format!(
                    "layer {layer}'s {which} holds a value that is not finite (NaN or infinity) at value {at} (token {}): \
                     the file was written by a broken run or altered",
                    at / n_kv_embd.max(1)
                )));
            }
        }
    }
    session.import_state(&tokens, &layers)?;
    Ok(tokens)
}

/// Write a file through `fill` into a new temporary file beside `path`, then rename it over
/// `path`: readers see the old file or the new one, never a part. On failure the temporary
/// file is removed and `path` is untouched. A `path` that exists and is not a regular file (a
/// FIFO, a device, a directory) is refused: the rename would replace it.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), SessionFileError> {
    let io = |source| SessionFileError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            return Err(SessionFileError::Refused {
                path: path.display().to_string(),
                check: format!(
                    "it is {}, not a regular file to save into",
                    crate::fs_safe::describe(meta.file_type())
                ),
            });
        }
    }
    crate::fs_safe::replace_with(path, |file| {
        fill(file)?;
        file.sync_all()
    })
    .map_err(io)
}

/// Where the first value of `rows` (stored as `dtype`) that is not finite is, counted in
/// values (for Q8_0, the first value of the first block whose scale is not finite); `None`
/// when every one is.
fn first_non_finite(dtype: DType, rows: &[u8]) -> Option<usize> {
    // An f16 is infinite or NaN exactly when its five exponent bits are all set.
    let f16_finite = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00;
    match dtype {
        DType::F32 => rows
            .chunks_exact(4)
            .position(|b| !f32::from_le_bytes(b.try_into().expect("4 bytes")).is_finite()),
        DType::F16 => rows.chunks_exact(2).position(|b| !f16_finite(b)),
        // A block is an f16 scale, then 32 i8 values: only the scale can be out of range.
        DType::Q8_0 => rows
            .chunks_exact(DType::Q8_0.bytes(32))
            .position(|b| !f16_finite(b))
            .map(|block| block * 32),
        DType::I32 => None,
    }
}

/// FNV-1a, 64 bits: a checksum against corruption, not an adversary.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_or_a_q8_0_scale_that_is_not_finite_is_found_where_it_is() {
        let f32s: Vec<u8> = [1.0f32, -2.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(first_non_finite(DType::F32, &f32s), Some(2));
        assert_eq!(first_non_finite(DType::F32, &f32s[..8]), None);
        assert_eq!(first_non_finite(DType::F32, &f32::NEG_INFINITY.to_le_bytes()), Some(0));
        let f16s = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
        // 1.0, the largest finite f16, -infinity, NaN.
        assert_eq!(first_non_finite(DType::F16, &f16s(&[0x3c00, 0x7bff])), None);
        assert_eq!(first_non_finite(DType::F16, &f16s(&[0x3c00, 0x7bff, 0xfc00])), Some(2));
        assert_eq!(first_non_finite(DType::F16, &f16s(&[0x7e00])), Some(0));
        // Two Q8_0 blocks: any i8 is a value, only a scale can be out of range.
        let mut blocks = vec![0xffu8; 68];
        blocks[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        blocks[34..36].copy_from_slice(&0x3c00u16.to_le_bytes());
        assert_eq!(first_non_finite(DType::Q8_0, &blocks), None);
        blocks[34..36].copy_from_slice(&0x7c01u16.to_le_bytes());
        assert_eq!(first_non_finite(DType::Q8_0, &blocks), Some(32));
    }
}
