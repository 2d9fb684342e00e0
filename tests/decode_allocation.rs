//! A decode step allocates nothing: no per-token buffers, graph rebuilds or vocabulary copies.
//! This test binary counts every allocation with a wrapping global allocator, so it holds the
//! whole step to that: the graph's inputs, every CPU kernel on one and on two threads, and
//! sampling from the logits.

mod common;

use minfer::engine::{Model, ModelOptions, Session};
use minfer::sampling::{Sampler, SamplingParams};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as for `alloc`; the pointer came from this allocator with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the pointer came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn decode_allocations(arch: &str, ty: &str, threads: usize) -> usize {
    let options = ModelOptions {
        n_threads: Some(threads),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    let model = Model::load(common::tiny_model(arch, ty), &options).unwrap();
    let mut session = Session::new(&model, 128);
    let mut sampler = Sampler::new(SamplingParams::default()).unwrap();
    let mut history: Vec<u32> = Vec::with_capacity(64);
    history.extend([1u32, 2, 3, 4, 5, 6, 7, 8]);
    session.eval(&history, 1).unwrap();
    // The first decode step builds the decode graph and sizes the sampler's buffers; the second
    // is the graph's first reuse, which debug builds check against a fresh build.
    let mut step = |session: &mut Session, history: &mut Vec<u32>| {
        let logits = session.last_logits().unwrap();
        let next = sampler.sample(logits, history).unwrap();
        history.push(next);
        session.eval(&[next], 1).unwrap();
    };
    step(&mut session, &mut history);
    step(&mut session, &mut history);
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..16 {
        step(&mut session, &mut history);
    }
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

#[test]
fn decode_steps_allocate_nothing_on_one_or_two_threads() {
    for (arch, ty) in [("qwen2", "Q8_0"), ("qwen2", "Q4_K"), ("qwen3", "F16")] {
        for threads in [1, 2] {
            assert_eq!(
                decode_allocations(arch, ty, threads),
                0,
                "{arch} {ty} on {threads} threads"
            );
        }
    }
}
