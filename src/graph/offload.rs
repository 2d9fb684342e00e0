//! Partial offload (llama.cpp's `-ngl N`): which nodes stay on the CPU when only the last N
//! layers go to a device. Each node is placed in the model's stack — the embedding lookup, a
//! layer, or the output head — from the weights it names and the KV layer it touches, or else from
//! its sources; the embedding lookup, the layers before the last N and (unless N exceeds the
//! layer count) the head are pinned to the CPU before the scheduler assigns the rest by priority.
//!
//! Knows the CPU's handle and the GGUF naming of layer weights (`blk.N.`); must not know any
//! other backend.

use super::{Backend, ComputeGraph, NodeMeta};

/// Where a node sits in the model's stack, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// The token embedding lookup.
    Embedding,
    /// Repeating layer `il`.
    Layer(usize),
    /// After the last layer: the output norm and projection.
    Head,
}

/// The layer a GGUF tensor name belongs to (`blk.3.attn_q.weight` → 3).
fn layer_of(weight: &str) -> Option<usize> {
    weight.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Each node's place; `None` for nodes that belong nowhere (the graph's inputs).
pub fn places(graph: &ComputeGraph) -> Vec<Option<Place>> {
    let mut places: Vec<Option<Place>> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let named = node.weight_names();
        let own = if matches!(node.meta, NodeMeta::Embed(_)) {
            Some(Place::Embedding)
        } else if let Some(il) = node.kv_layer().or_else(|| named.iter().find_map(|(n, _)| layer_of(n))) {
            Some(Place::Layer(il))
        } else if !named.is_empty() {
            // A weight outside the layers that is no embedding table: the output norm or head
            // (a tied head names the embedding table, but multiplies by it).
            Some(Place::Head)
        } else {
            None
        };
        // An activation-only node (a residual add, a RoPE) belongs where its latest source does.
        let place = own.or_else(|| node.src.iter().filter_map(|&s| places[s]).max());
        places.push(place);
    }
    places
}

/// The number of repeating layers the graph runs (its highest layer plus one).
pub fn n_layer(places: &[Option<Place>]) -> usize {
    places
        .iter()
        .filter_map(|p| match p {
            Some(Place::Layer(il)) => Some(il + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Pin to the CPU what a device with `n_gpu_layers` of the layers does not run: the embedding
/// lookup, every layer before the last `n_gpu_layers`, and the head unless `n_gpu_layers`
/// exceeds the layer count (llama.cpp's rule). Nodes already assigned are left as they are.
pub fn pin_to_cpu(graph: &mut ComputeGraph, n_gpu_layers: usize) {
    let places = places(graph);
    let n_layer = n_layer(&places);
    let first_on_device = n_layer.saturating_sub(n_gpu_layers);
    for (node, place) in graph.nodes.iter_mut().zip(places) {
        let on_cpu = match place {
            Some(Place::Embedding) => true,
            Some(Place::Layer(il)) => il < first_on_device,
            Some(Place::Head) => n_gpu_layers <= n_layer,
            None => false,
        };
        if on_cpu && node.backend.is_none() {
            node.backend = Some(Backend::CPU);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_is_read_from_the_gguf_name() {
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("blk.23.ffn_down.weight"), Some(23));
        assert_eq!(layer_of("output_norm.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
    }
}
