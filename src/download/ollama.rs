//! `ollama:NAME[:TAG]`: the model layer of an Ollama registry image.
//!
//! The registry speaks the OCI distribution API: the manifest
//! (`GET {registry}/v2/library/NAME/manifests/TAG`, or `/v2/USER/NAME/...` for a user's model)
//! lists layers by media type and digest; the one of type `application/vnd.ollama.image.model`
//! is the GGUF file, fetched from `/v2/.../blobs/sha256:...` (which redirects to the blob store)
//! and verified against that digest. The other layers (template, parameters, licence) are not
//! fetched: minfer reads the chat template from the GGUF file itself.

use super::http::Client;
use super::{Config, DownloadError, Plan, RemoteFile};

const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const MANIFEST_TYPES: &str =
    "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json";

pub(super) fn plan(client: &Client, config: &Config, name: &str, tag: &str) -> Result<Plan, DownloadError> {
    let path = if name.contains('/') {
        name.to_string()
    } else {
        format!("library/{name}")
    };
    let url = format!("{}/v2/{path}/manifests/{tag}", config.ollama_registry);
    let response = client.get(&url, &[("Accept", MANIFEST_TYPES.to_string())])?;
    match response.status() {
        200 => {}
        404 => {
            return Err(DownloadError::OllamaNotFound {
                name: name.to_string(),
                tag: tag.to_string(),
                registry: config.ollama_registry.clone(),
            })
        }
        _ => return Err(response.status_error()),
    }
    let manifest = response.json()?;
    let (digest, size) = model_layer(&url, &manifest)?;
    Ok(Plan {
        origin: format!("ollama:{name}"),
        files: vec![RemoteFile {
            url: format!("{}/v2/{path}/blobs/sha256:{digest}", config.ollama_registry),
            name: format!("ollama-{}-{tag}.gguf", name.replace('/', "-")),
            size,
            sha256: Some(digest),
            auth_repo: None,
        }],
    })
}

/// The model layer's sha256 (lowercase hex) and size.
fn model_layer(url: &str, manifest: &serde_json::Value) -> Result<(String, u64), DownloadError> {
    let bad = |reason: String| DownloadError::BadResponse {
        url: url.to_string(),
        reason,
    };
    let layers = manifest
        .get("layers")
        .and_then(|l| l.as_array())
        .ok_or_else(|| bad("the manifest has no layers".into()))?;
    let layer = layers
        .iter()
        .find(|l| l.get("mediaType").and_then(|m| m.as_str()) == Some(MODEL_LAYER))
        .ok_or_else(|| bad(format!("the manifest has no {MODEL_LAYER} layer")))?;
    let digest = layer
        .get("digest")
        .and_then(|d| d.as_str())
        .and_then(|d| d.strip_prefix("sha256:"))
        .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            bad(format!(
                "the model layer's digest is not sha256:<64 hex digits>: {layer}"
            ))
        })?;
    let size = layer
        .get("size")
        .and_then(|s| s.as_u64())
        .ok_or_else(|| bad(format!("the model layer has no size: {layer}")))?;
    Ok((digest.to_ascii_lowercase(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_layer_is_found_by_its_media_type() {
        let digest = "a".repeat(64);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "layers": [
                {"mediaType": "application/vnd.ollama.image.template", "digest": format!("sha256:{}", "b".repeat(64)), "size": 3},
                {"mediaType": MODEL_LAYER, "digest": format!("sha256:{digest}"), "size": 42},
            ]
        });
        assert_eq!(model_layer("u", &manifest).unwrap(), (digest, 42));
        let no_model = serde_json::json!({"layers": [{"mediaType": "x", "digest": "sha256:1", "size": 1}]});
        assert!(model_layer("u", &no_model)
            .unwrap_err()
            .to_string()
            .contains(MODEL_LAYER));
        let bad_digest = serde_json::json!({"layers": [{"mediaType": MODEL_LAYER, "digest": "md5:1", "size": 1}]});
        assert!(model_layer("u", &bad_digest).unwrap_err().to_string().contains("md5:1"));
    }
}
