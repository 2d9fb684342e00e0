//! `hf:OWNER/REPO[:QUANT]`: which files of a Hugging Face repository to fetch.
//!
//! The repository is listed with the tree API huggingface_hub's `list_repo_tree` uses
//! (`GET {endpoint}/api/models/{repo}/tree/main?recursive=true`, paginated by `Link` headers),
//! which gives every LFS file's sha256 and size. The GGUF model whose name carries QUANT
//! (case-insensitively, as a whole word: `Q4_K` does not pick `Q4_K_M`) is chosen, with every
//! part of a split model; files come from `{endpoint}/{repo}/resolve/main/{path}`, which
//! redirects to the blob store. Vision projectors (`mmproj-*.gguf`) are not models.

use super::http::Client;
use super::{Config, DownloadError, Plan, RemoteFile, DEFAULT_QUANT};
use crate::gguf::split::parse_split_path;

/// A listing longer than this many pages, or files, is not a model repository we can use (and
/// the bound keeps a hostile listing from filling memory).
const MAX_PAGES: usize = 1000;
const MAX_FILES: usize = 100_000;
/// The longest file path a listing may name.
const MAX_PATH_BYTES: usize = 1024;

/// A file of the repository, as the tree lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    path: String,
    size: u64,
    sha256: Option<String>,
}

/// One model of the repository: a file, or a split model's parts in order.
#[derive(Debug)]
struct Model<'a> {
    /// The path without `.gguf` and without the split suffix.
    stem: String,
    parts: Vec<&'a Listed>,
}

pub(super) fn plan(client: &Client, config: &Config, repo: &str, quant: Option<&str>) -> Result<Plan, DownloadError> {
    let listed = list(client, config, repo)?;
    let model = choose(repo, &listed, quant)?;
    let files = model
        .parts
        .iter()
        .map(|f| {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path).to_string();
            if name.starts_with('.') || name.contains('\\') || name.chars().any(char::is_control) {
                return Err(DownloadError::BadResponse {
                    url: format!("{}/{repo}", config.hf_endpoint),
                    reason: format!("the file name {name:?} cannot be a cache name"),
                });
            }
            Ok(RemoteFile {
                url: format!("{}/{repo}/resolve/main/{}", config.hf_endpoint, encode_path(&f.path)),
                name,
                size: f.size,
                sha256: f.sha256.clone(),
                auth_repo: Some(repo.to_string()),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Plan {
        origin: format!("hf:{repo}"),
        files,
    })
}

fn auth_headers(config: &Config, url: &str) -> Vec<(&'static str, String)> {
    match &config.hf_token {
        // Only to the endpoint: a `Link` could point anywhere.
        Some(token) if url.starts_with(&format!("{}/", config.hf_endpoint)) => {
            vec![("Authorization", format!("Bearer {token}"))]
        }
        _ => Vec::new(),
    }
}

fn list(client: &Client, config: &Config, repo: &str) -> Result<Vec<Listed>, DownloadError> {
    let mut url = format!("{}/api/models/{repo}/tree/main?recursive=true", config.hf_endpoint);
    let mut files = Vec::new();
    for _ in 0..MAX_PAGES {
        let response = client.get(&url, &auth_headers(config, &url))?;
        match response.status() {
            200 => {}
            status @ (401 | 403) => {
                return Err(DownloadError::Unauthorized {
                    repo: repo.to_string(),
                    status,
                    token_given: config.hf_token.is_some(),
                })
            }
            404 if response.header("x-error-code") != Some("RevisionNotFound") => {
                return Err(DownloadError::RepoNotFound {
                    repo: repo.to_string(),
                    endpoint: config.hf_endpoint.clone(),
                })
            }
            _ => return Err(response.status_error()),
        }
        let next = response
            .header("link")
            .and_then(next_link)
            .map(|next| absolute(&url, &next));
        let page = response.json()?;
        files.extend(parse_tree(&url, &page)?);
        if files.len() > MAX_FILES {
            return Err(DownloadError::BadResponse {
                url,
                reason: format!("the listing names more than {MAX_FILES} files"),
            });
        }
        match next {
            Some(next) => url = next,
            None => return Ok(files),
        }
    }
    Err(DownloadError::BadResponse {
        url,
        reason: format!("the listing runs past {MAX_PAGES} pages"),
    })
}

/// The files of one page of the tree API's answer.
fn parse_tree(url: &str, page: &serde_json::Value) -> Result<Vec<Listed>, DownloadError> {
    let bad = |reason: String| DownloadError::BadResponse {
        url: url.to_string(),
        reason,
    };
    let entries = page
        .as_array()
        .ok_or_else(|| bad("the tree listing is not a JSON array".into()))?;
    let mut files = Vec::new();
    for entry in entries {
        if entry.get("type").and_then(|t| t.as_str()) != Some("file") {
            continue;
        }
        let path = entry
            .get("path")
            .and_then(|p| p.as_str())
            .ok_or_else(|| bad(format!("a file without a path: {entry}")))?;
        // Only models are kept, so a listing's size bounds what is held, not its file count.
        if !path.to_ascii_lowercase().ends_with(".gguf") {
            continue;
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(bad(format!(
                "a file path of {} bytes (at most {MAX_PATH_BYTES})",
                path.len()
            )));
        }
        let size_of = |v: &serde_json::Value| v.get("size").and_then(|s| s.as_u64());
        let (size, sha256) = match entry.get("lfs").filter(|l| !l.is_null()) {
            Some(lfs) => {
                let oid = lfs
                    .get("oid")
                    .or_else(|| lfs.get("sha256"))
                    .and_then(|o| o.as_str())
                    .filter(|o| o.len() == 64 && o.bytes().all(|b| b.is_ascii_hexdigit()))
                    .ok_or_else(|| bad(format!("{path}: the LFS entry has no sha256: {lfs}")))?;
                let size = size_of(lfs)
                    .or_else(|| size_of(entry))
                    .ok_or_else(|| bad(format!("{path}: no size")))?;
                (size, Some(oid.to_ascii_lowercase()))
            }
            None => (size_of(entry).ok_or_else(|| bad(format!("{path}: no size")))?, None),
        };
        files.push(Listed {
            path: path.to_string(),
            size,
            sha256,
        });
    }
    Ok(files)
}

/// The `rel="next"` target of a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|link| {
        let (target, params) = link.split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| target.to_string())
    })
}

/// `next` made absolute against `base` (a `Link` may give a path only).
fn absolute(base: &str, next: &str) -> String {
    if next.starts_with("http://") || next.starts_with("https://") {
        return next.to_string();
    }
    let origin_end = base
        .find("://")
        .and_then(|i| base[i + 3..].find('/').map(|j| i + 3 + j))
        .unwrap_or(base.len());
    format!("{}/{}", &base[..origin_end], next.trim_start_matches('/'))
}

/// A repository path as a URL path: every byte but the unreserved ones and `/` escaped.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The repository's GGUF models, split parts grouped, in listing order.
fn models(listed: &[Listed]) -> Vec<Model<'_>> {
    let mut models: Vec<Model> = Vec::new();
    for file in listed {
        let base = file.path.rsplit('/').next().unwrap_or(&file.path);
        if !base.to_ascii_lowercase().ends_with(".gguf") || base.to_ascii_lowercase().starts_with("mmproj") {
            continue;
        }
        let stem = match parse_split_path(&file.path) {
            Some((prefix, _, _)) => prefix.to_string(),
            None => file.path[..file.path.len() - ".gguf".len()].to_string(),
        };
        match models.iter_mut().find(|m| m.stem == stem) {
            Some(m) => m.parts.push(file),
            None => models.push(Model {
                stem,
                parts: vec![file],
            }),
        }
    }
    for m in &mut models {
        m.parts
            .sort_by_key(|f| parse_split_path(&f.path).map_or(0, |(_, no, _)| no));
    }
    models
}

/// Whether `stem` carries `quant` as a whole word: not preceded by a letter or digit, not
/// followed by one or by `_` (so `Q4_K` is not `Q4_K_M`, nor `Q4_0` part of `IQ4_0`).
fn quant_matches(stem: &str, quant: &str) -> bool {
    let (stem, quant) = (stem.to_ascii_lowercase(), quant.to_ascii_lowercase());
    let bytes = stem.as_bytes();
    stem.match_indices(&quant).any(|(i, _)| {
        let before = i.checked_sub(1).map(|j| bytes[j]);
        let after = bytes.get(i + quant.len()).copied();
        !before.is_some_and(|b| b.is_ascii_alphanumeric())
            && !after.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// The quant a model's name carries, for the list of what a repository offers: the last word
/// that looks like one (`Q4_K_M`, `IQ2_XXS`, `F16`, `BF16`), else the file name.
fn quant_label(stem: &str) -> String {
    let looks_like_quant = |w: &str| {
        let w = w.to_ascii_uppercase();
        ["Q", "IQ", "TQ", "F", "BF", "MXFP"].iter().any(|p| {
            w.strip_prefix(p)
                .and_then(|rest| rest.bytes().next())
                .is_some_and(|b| b.is_ascii_digit())
        })
    };
    stem.split(['-', '.', '/'])
        .rev()
        .find(|w| looks_like_quant(w))
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| stem.rsplit('/').next().unwrap_or(stem).to_string())
}

fn choose<'a>(repo: &str, listed: &'a [Listed], quant: Option<&str>) -> Result<Model<'a>, DownloadError> {
    let mut all = models(listed);
    if all.is_empty() {
        return Err(DownloadError::NoGguf { repo: repo.to_string() });
    }
    let wanted = quant.unwrap_or(DEFAULT_QUANT);
    let mut matching: Vec<usize> = (0..all.len())
        .filter(|&i| quant_matches(&all[i].stem, wanted))
        .collect();
    if quant.is_none() && matching.is_empty() && all.len() == 1 {
        matching.push(0);
    }
    let model = match matching.as_slice() {
        [i] => all.swap_remove(*i),
        [] if quant.is_some() || all.len() > 1 => {
            let mut available: Vec<String> = all.iter().map(|m| quant_label(&m.stem)).collect();
            available.sort();
            available.dedup();
            if quant.is_none() {
                return Err(DownloadError::Ambiguous {
                    repo: repo.to_string(),
                    what: "a reference without a quant".into(),
                    files: available,
                });
            }
            return Err(DownloadError::NoSuchQuant {
                repo: repo.to_string(),
                quant: wanted.to_string(),
                available,
            });
        }
        several => {
            return Err(DownloadError::Ambiguous {
                repo: repo.to_string(),
                what: wanted.to_string(),
                files: several.iter().map(|&i| all[i].parts[0].path.clone()).collect(),
            })
        }
    };
    let announced = parse_split_path(&model.parts[0].path).map_or(1, |(_, _, count)| count);
    let complete = model.parts.len() == announced as usize
        && model
            .parts
            .iter()
            .enumerate()
            .all(|(i, f)| parse_split_path(&f.path).map_or(i == 0, |(_, no, _)| no as usize == i));
    if !complete {
        return Err(DownloadError::MissingParts {
            repo: repo.to_string(),
            prefix: model.stem.clone(),
            count: announced,
            found: model.parts.len(),
        });
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> Vec<Listed> {
        paths
            .iter()
            .map(|p| Listed {
                path: p.to_string(),
                size: 1,
                sha256: None,
            })
            .collect()
    }

    fn chosen(listed: &[Listed], quant: Option<&str>) -> Result<Vec<String>, DownloadError> {
        choose("o/r", listed, quant).map(|m| m.parts.iter().map(|f| f.path.clone()).collect())
    }

    #[test]
    fn the_quant_is_matched_as_a_whole_word_ignoring_case() {
        let listed = files(&[
            "README.md",
            "m-IQ4_XS.gguf",
            "m-q4_k.gguf",
            "m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "mmproj-m-f16.gguf",
        ]);
        assert_eq!(chosen(&listed, Some("q4_k_m")).unwrap(), ["m-Q4_K_M.gguf"]);
        assert_eq!(chosen(&listed, Some("Q4_K")).unwrap(), ["m-q4_k.gguf"]);
        assert_eq!(chosen(&listed, None).unwrap(), ["m-Q4_K_M.gguf"], "the default quant");
        let err = chosen(&listed, Some("Q5_K_M")).unwrap_err();
        assert!(
            err.to_string()
                .contains("the quants available are: IQ4_XS, Q4_K, Q4_K_M, Q8_0"),
            "{err}"
        );
    }

    #[test]
    fn without_a_quant_the_only_model_is_taken_and_several_are_refused() {
        assert_eq!(chosen(&files(&["a-F16.gguf"]), None).unwrap(), ["a-F16.gguf"]);
        let err = chosen(&files(&["a-F16.gguf", "a-Q8_0.gguf"]), None).unwrap_err();
        assert!(matches!(err, DownloadError::Ambiguous { .. }), "{err}");
        assert!(err.to_string().contains("F16, Q8_0"), "{err}");
        let err = chosen(&files(&["README.md"]), None).unwrap_err();
        assert!(matches!(err, DownloadError::NoGguf { .. }), "{err}");
    }

    #[test]
    fn a_split_model_is_taken_whole_in_part_order() {
        let listed = files(&[
            "Q8_0/m-Q8_0-00002-of-00002.gguf",
            "Q8_0/m-Q8_0-00001-of-00002.gguf",
            "m-Q4_0.gguf",
        ]);
        assert_eq!(
            chosen(&listed, Some("Q8_0")).unwrap(),
            ["Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"]
        );
        let err = chosen(&listed[1..], Some("Q8_0")).unwrap_err();
        assert!(
            matches!(err, DownloadError::MissingParts { count: 2, found: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_tree_listing_gives_lfs_digests_and_sizes() {
        let page = serde_json::json!([
            {"type": "directory", "path": "Q8_0"},
            {"type": "file", "path": "README.md", "size": 10, "oid": "abc"},
            {"type": "file", "path": "m.gguf", "size": 7,
             "lfs": {"oid": "AB".repeat(32), "size": 7, "pointerSize": 130}},
        ]);
        // Only the models are kept.
        let listed = parse_tree("u", &page).unwrap();
        assert_eq!(
            listed,
            [Listed {
                path: "m.gguf".into(),
                size: 7,
                sha256: Some("ab".repeat(32))
            }]
        );
        let bad = serde_json::json!([{"type": "file", "path": "m.gguf", "size": 7, "lfs": {"oid": "zz"}}]);
        assert!(parse_tree("u", &bad).unwrap_err().to_string().contains("m.gguf"));
        let long = serde_json::json!([{"type": "file", "path": format!("{}.gguf", "a".repeat(2000)), "size": 7}]);
        assert!(parse_tree("u", &long).unwrap_err().to_string().contains("2005 bytes"));
    }

    #[test]
    fn the_next_page_comes_from_the_link_header() {
        let header = r#"<https://hf.co/api/models/o/r/tree/main?recursive=true&cursor=xyz>; rel="next""#;
        assert_eq!(
            next_link(header).as_deref(),
            Some("https://hf.co/api/models/o/r/tree/main?recursive=true&cursor=xyz")
        );
        assert_eq!(next_link(r#"<https://x/a>; rel="prev""#), None);
        assert_eq!(
            absolute("http://127.0.0.1:9/api/x?y", "/api/z?c=1"),
            "http://127.0.0.1:9/api/z?c=1"
        );
    }

    #[test]
    fn paths_are_escaped_for_urls() {
        assert_eq!(encode_path("Q8_0/a b+c.gguf"), "Q8_0/a%20b%2Bc.gguf");
    }
}
