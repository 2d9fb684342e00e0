//! A hostile file must not make the reader allocate more than its own size justifies. This
//! test binary counts every allocation with a wrapping global allocator.

use minfer::gguf::parse_header;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: the pointer came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// Peak bytes allocated while parsing `bytes` (which may fail).
fn peak_while_parsing(bytes: &[u8]) -> usize {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let _ = parse_header(bytes);
    PEAK.load(Ordering::SeqCst) - base
}

#[test]
fn parsing_allocates_a_bounded_multiple_of_the_file_size() {
    // Each case claims as much as its header allows; the real content is 1 MiB of padding.
    let pad = 1 << 20;
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();

    // A string array whose count is the most the remaining bytes could hold (8 bytes each).
    let mut b = header(0, 1);
    string(&mut b, "tokens");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&((pad / 8) as u64).to_le_bytes());
    b.resize(b.len() + pad, 0);
    cases.push(("strings", b));

    // Nested empty arrays (12 bytes each).
    let mut b = header(0, 1);
    string(&mut b, "nested");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&((pad / 12) as u64).to_le_bytes());
    for _ in 0..pad / 12 {
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    cases.push(("nested arrays", b));

    // As many tensor infos as fit, each an empty name with 0 dims.
    let n = pad / 24;
    let mut b = header(n as u64, 0);
    b.resize(b.len() + pad, 0);
    cases.push(("tensor infos", b));

    // A huge claimed count with no bytes behind it.
    let mut b = header(0, 1);
    string(&mut b, "a");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    cases.push(("huge u8 array", b));

    for (what, bytes) in cases {
        let peak = peak_while_parsing(&bytes);
        assert!(
            peak <= 8 * bytes.len() + (1 << 16),
            "{what}: {peak} bytes allocated for a {}-byte file",
            bytes.len()
        );
    }
}
