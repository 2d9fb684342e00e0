//! An opened GGUF model: one memory-mapped file, or every part of a split model merged into
//! one tensor index. Tensor data is borrowed from the maps, never copied (unless the caller
//! asks for the file to be read into memory instead: [`OpenOptions::no_mmap`]).

use super::error::{GgufError, Result};
use super::reader::{parse_header, Header, TensorInfo};
use super::split::{parse_split_path, split_path, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use super::value::Metadata;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Part {
    path: PathBuf,
    bytes: Bytes,
    data_offset: u64,
}

/// A part's bytes: mapped, or read into memory.
enum Bytes {
    Map(Mmap),
    /// Words, so that the bytes are 8-aligned as a map's are page-aligned (the kernels read
    /// f32 and f16 tensors in place); `len` bytes of them are the file's.
    Owned {
        words: Vec<u64>,
        len: usize,
    },
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(map) => map,
            Bytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// How [`GgufFile::open_with`] brings the file into memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Read each part into memory instead of mapping it (llama.cpp's `--no-mmap`): the pages
    /// are then the process's own and cannot be dropped and re-read from the file.
    pub no_mmap: bool,
    /// Lock the model's pages in memory (`mlock`, llama.cpp's `--mlock`), so that the system
    /// never swaps them out or drops them.
    pub mlock: bool,
}

/// A GGUF model opened for reading.
pub struct GgufFile {
    parts: Vec<Part>,
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

/// The file at `path`, mapped or read into memory, and locked there, as `options` say.
fn load_file(path: &Path, options: OpenOptions) -> Result<Bytes> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let kind = std::fs::metadata(path).map_err(io)?.file_type();
    if !kind.is_file() {
        return Err(GgufError::NotAFile {
            path: path.to_path_buf(),
            what: crate::fs_safe::describe(kind),
        });
    }
    // Opened without blocking and checked again: a path swapped for a FIFO after the check
    // above must not block the open (a regular file's reads ignore the flag).
    let file = crate::fs_safe::open_nonblocking(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(GgufError::NotAFile {
            path: path.to_path_buf(),
            what: crate::fs_safe::describe(meta.file_type()),
        });
    }
    let len = meta.len();
    if len < 4 {
        return Err(GgufError::Truncated {
            what: "magic".into(),
            offset: 0,
            needed: 4,
            available: len,
        }
        .in_file(path));
    }
    let bytes = if options.no_mmap {
        let len = usize::try_from(len).map_err(|_| io(std::io::Error::other("the file is larger than memory")))?;
        let mut words = Vec::new();
        words.try_reserve_exact(len.div_ceil(8)).map_err(|_| {
            io(std::io::Error::other(format!(
                "cannot allocate {len} bytes to read it into"
            )))
        })?;
        words.resize(len.div_ceil(8), 0u64);
        let buf: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut words)[..len];
        std::io::Read::read_exact(&mut &file, buf).map_err(io)?;
        Bytes::Owned { words, len }
    } else {
        // SAFETY: the map is read-only. Another process truncating or rewriting the file while
        // we hold it is outside what any mmap-based reader (llama.cpp included) can defend
        // against.
        Bytes::Map(unsafe { Mmap::map(&file) }.map_err(io)?)
    };
    if options.mlock {
        lock(&bytes).map_err(|source| GgufError::Mlock {
            path: path.to_path_buf(),
            bytes: bytes.len() as u64,
            source,
        })?;
    }
    Ok(bytes)
}

/// Locks `bytes`' pages in memory. The lock lasts as long as the mapping or the allocation.
fn lock(bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        // SAFETY: the range is memory this process owns (a map or an allocation) for as long
        // as the part lives; mlock only pins it.
        if unsafe { libc::mlock(bytes.as_ptr().cast(), bytes.len()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = bytes;
        Err(std::io::Error::other("mlock is only available on Unix"))
    }
}

fn open_part(path: &Path, options: OpenOptions) -> Result<(Part, Header)> {
    let bytes = load_file(path, options)?;
    let header = parse_header(&bytes).map_err(|e| e.in_file(path))?;
    Ok((
        Part {
            path: path.to_path_buf(),
            bytes,
            data_offset: header.data_offset,
        },
        header,
    ))
}

fn split_count(metadata: &Metadata, path: &Path) -> Result<u32> {
    match metadata.get(KEY_SPLIT_COUNT) {
        None => Ok(1),
        Some(_) => Ok(metadata.get_u16(KEY_SPLIT_COUNT).map_err(|e| e.in_file(path))? as u32),
    }
}

impl GgufFile {
    /// Open a GGUF file. If it is one part of a split model (`split.count` > 1), every part is
    /// opened — whichever part was named — and their tensors are merged into one index; the
    /// metadata is the first part's, as in llama.cpp.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, OpenOptions::default())
    }

    /// [`GgufFile::open`], read into memory or locked there as `options` say.
    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        let path = path.as_ref();
        let (part, header) = open_part(path, options)?;
        let count = split_count(&header.metadata, path)?;
        if count <= 1 {
            return Ok(Self::assemble(vec![(part, header)]));
        }
        // The named part, already open: read (with --no-mmap) and locked once, not twice.
        let mut named = Some((part, header));

        let split_err = |reason: String| GgufError::Split {
            path: path.to_path_buf(),
            reason,
        };
        let name = path
            .to_str()
            .ok_or_else(|| split_err("the path is not valid UTF-8".into()))?;
        let (prefix, _, named_count) = parse_split_path(name).ok_or_else(|| {
            split_err(format!(
                "{KEY_SPLIT_COUNT} = {count}, but the name does not end in -NNNNN-of-NNNNN.gguf"
            ))
        })?;
        if named_count != count {
            return Err(split_err(format!(
                "the name says {named_count} parts, {KEY_SPLIT_COUNT} says {count}"
            )));
        }

        let mut parts = Vec::with_capacity(count as usize);
        for no in 0..count {
            let part_path = PathBuf::from(split_path(prefix, no, count));
            let (part, mut header) = match named.take_if(|_| part_path == path) {
                Some(opened) => opened,
                None => open_part(&part_path, options)?,
            };
            let got_no = header
                .metadata
                .get_u16(KEY_SPLIT_NO)
                .map_err(|e| e.in_file(&part_path))? as u32;
            let got_count = split_count(&header.metadata, &part_path)?;
            if got_no != no || got_count != count {
                return Err(GgufError::Split {
                    path: part_path,
                    reason: format!("expected part {} of {count}, the file says {KEY_SPLIT_NO} = {got_no}, {KEY_SPLIT_COUNT} = {got_count}", no),
                });
            }
            for t in &mut header.tensors {
                t.part = no as usize;
            }
            parts.push((part, header));
        }
        let file = Self::assemble(parts);

        // Tensor names must be unique across parts, and their total must match the first part's
        // announcement.
        let total: usize = file.tensors.len();
        if file.by_name.len() != total {
            let mut seen = HashMap::new();
            for t in &file.tensors {
                if let Some(first) = seen.insert(t.name.as_str(), t.part) {
                    return Err(GgufError::DuplicateTensor {
                        name: t.name.clone(),
                        location: format!(" in parts {} and {} of {}", first + 1, t.part + 1, path.display()),
                    });
                }
            }
        }
        if file.metadata.contains(KEY_SPLIT_TENSORS_COUNT) {
            let announced = file
                .metadata
                .get_i32(KEY_SPLIT_TENSORS_COUNT)
                .map_err(|e| e.in_file(path))?;
            if announced as i64 != total as i64 {
                return Err(split_err(format!(
                    "{KEY_SPLIT_TENSORS_COUNT} = {announced}, the parts hold {total} tensors"
                )));
            }
        }
        Ok(file)
    }

    fn assemble(parts: Vec<(Part, Header)>) -> Self {
        let version = parts[0].1.version;
        let alignment = parts[0].1.alignment;
        let metadata = parts[0].1.metadata.clone();
        let mut tensors = Vec::new();
        let mut maps = Vec::with_capacity(parts.len());
        for (part, header) in parts {
            tensors.extend(header.tensors);
            maps.push(part);
        }
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            by_name.entry(t.name.clone()).or_insert(i);
        }
        GgufFile {
            parts: maps,
            version,
            alignment,
            metadata,
            tensors,
            by_name,
        }
    }

    /// The GGUF version of the (first) file: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes: `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The metadata of the (first) file.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor, in file order (part by part).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Count of tensors and bytes per ggml type, most frequent first (ties by type id).
    pub fn tensor_type_counts(&self) -> Vec<(crate::quant::GgmlType, usize, u64)> {
        let mut by_type: std::collections::BTreeMap<crate::quant::GgmlType, (usize, u64)> = Default::default();
        for t in &self.tensors {
            let e = by_type.entry(t.ggml_type).or_default();
            e.0 += 1;
            e.1 += t.size;
        }
        let mut counts: Vec<_> = by_type.into_iter().map(|(t, (n, b))| (t, n, b)).collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        counts
    }

    /// The tensor named `name` (as in `blk.0.attn_q.weight`), or [`GgufError::MissingTensor`].
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor { name: name.to_string() })
    }

    /// The bytes of a tensor, borrowed from the memory map. The bounds were checked at open.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let part = &self.parts[info.part];
        let start = (part.data_offset + info.offset) as usize;
        &part.bytes[start..start + info.size as usize]
    }

    /// Gives the pages wholly inside a tensor's bytes back to the system when its part is
    /// memory-mapped (a backend that keeps its own copy calls this): they are read in again
    /// from the file if touched, so the bytes stay valid. Locked pages and files read into
    /// memory keep theirs.
    pub fn release_tensor(&self, info: &TensorInfo) {
        self.release_tensor_bytes(info, 0..info.size as usize);
    }

    /// [`GgufFile::release_tensor`] for bytes `range` of the tensor only (a view of some of its
    /// rows); a range outside the tensor releases nothing.
    pub fn release_tensor_bytes(&self, info: &TensorInfo, range: std::ops::Range<usize>) {
        let part = &self.parts[info.part];
        if !matches!(part.bytes, Bytes::Map(_)) {
            return;
        }
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .unwrap_or(4096)
                .max(1);
            let Some(data) = self.tensor_data(info).get(range) else {
                return;
            };
            let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
            let (first, last) = (start.next_multiple_of(page), end - end % page);
            if first < last {
                // SAFETY: the range lies inside `map`, a read-only file mapping this file owns;
                // dropping its pages only makes the next read fault them in from the file again.
                // A refusal (locked pages) leaves them as they were, which is harmless.
                unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED) };
            }
        }
    }

    /// The paths of the files this model was read from (one per part).
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.parts.iter().map(|p| p.path.as_path())
    }

    /// Total size of the files on disk.
    pub fn file_size(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes.len() as u64).sum()
    }
}
