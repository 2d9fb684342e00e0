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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
        } else if let Some(il) = node
            .op
            .kv_layer()
            .or_else(|| node.kv_layer())
            .or_else(|| named.iter().find_map(|(n, _)| layer_of(n)))
        {
            // The KV views (`KvcacheLoad`, no sources) too: a layer's view must stay beside its
            // store and attention, or every step would copy the whole region across.
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

/// Bytes of the weights each layer's nodes name (index = layer) and of the head's, from
/// `bytes_of` (a weight's size by name): what `-ngl auto` fits into a device's free memory.
pub fn weight_bytes_by_place(graph: &ComputeGraph, bytes_of: impl Fn(&str) -> usize) -> (Vec<usize>, usize) {
    let places = places(graph);
    let mut layers = vec![0usize; n_layer(&places)];
    let mut head = 0;
    let mut seen = std::collections::HashSet::new();
    for (node, place) in graph.nodes.iter().zip(places) {
        for (name, _) in node.weight_names() {
            // Once per place: a tied head multiplies by the embedding table, which the device
            // must then hold although the lookup stays on the CPU.
            if !seen.insert((name.clone(), place)) {
                continue;
            }
            match place {
                Some(Place::Layer(il)) => layers[il] += bytes_of(name),
                Some(Place::Head) => head += bytes_of(name),
                Some(Place::Embedding) | None => {}
            }
        }
    }
    (layers, head)
}

/// `-ngl auto`: the most layers whose weights fit in `budget` bytes, counted from the last
/// layer (the head too once every layer fits); `None` when everything fits (all layers and the
/// head, the same as no `-ngl`).
pub fn fit_layers(layer_bytes: &[usize], head_bytes: usize, budget: usize) -> Option<usize> {
    let mut used = 0usize;
    for (n, &bytes) in layer_bytes.iter().rev().enumerate() {
        used = used.saturating_add(bytes);
        if used > budget {
            return Some(n);
        }
    }
    if used.saturating_add(head_bytes) > budget {
        return Some(layer_bytes.len());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_fits_the_last_layers_that_fit_and_the_head_only_after_all_of_them() {
        let layers = [10, 20, 30, 40];
        assert_eq!(fit_layers(&layers, 5, 1000), None);
        assert_eq!(fit_layers(&layers, 5, 104), Some(4), "every layer but not the head");
        assert_eq!(fit_layers(&layers, 5, 100), Some(4));
        assert_eq!(fit_layers(&layers, 5, 99), Some(3), "40 + 30 + 20 fit, not the 10");
        assert_eq!(fit_layers(&layers, 5, 70), Some(2));
        assert_eq!(fit_layers(&layers, 5, 39), Some(0), "not even the last layer");
        assert_eq!(fit_layers(&[], 5, 4), Some(0));
        assert_eq!(fit_layers(&[], 5, 5), None);
    }

    #[test]
    fn a_layer_is_read_from_the_gguf_name() {
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("blk.23.ffn_down.weight"), Some(23));
        assert_eq!(layer_of("output_norm.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
    }
}
