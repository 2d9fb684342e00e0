//! Split models: the `name-00001-of-00003.gguf` naming llama.cpp's gguf-split uses, and the
//! `split.*` metadata keys each part carries.

/// Key holding the 0-based index of this part (u16).
pub const KEY_SPLIT_NO: &str = "split.no";
/// Key holding the number of parts (u16).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Key holding the total number of tensors over all parts (i32).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The path of part `split_no` (0-based) of `split_count`, as llama.cpp's `llama_split_path`
/// names it: `{prefix}-{no+1:05}-of-{count:05}.gguf`.
pub fn split_path(prefix: &str, split_no: u32, split_count: u32) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", split_no + 1, split_count)
}

/// Parse a split file name into its prefix, 0-based part index and part count, or `None` if
/// the name does not follow the split naming.
pub fn parse_split_path(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    // "-NNNNN-of-NNNNN" is 15 characters.
    if stem.len() < 15 || !stem.is_char_boundary(stem.len() - 15) {
        return None;
    }
    let (prefix, tail) = stem.split_at(stem.len() - 15);
    let tail = tail.strip_prefix('-')?;
    let (no, count) = tail.split_once("-of-")?;
    if no.len() != 5 || count.len() != 5 || !no.bytes().chain(count.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (no, count): (u32, u32) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some((prefix, no - 1, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths_follow_llama_cpp_naming_and_parse_back() {
        let p = split_path("/models/qwen", 1, 3);
        assert_eq!(p, "/models/qwen-00002-of-00003.gguf");
        assert_eq!(parse_split_path(&p), Some(("/models/qwen", 1, 3)));
        assert_eq!(parse_split_path("/models/qwen.gguf"), None);
        assert_eq!(parse_split_path("/models/qwen-00000-of-00003.gguf"), None);
        assert_eq!(parse_split_path("/models/qwen-00004-of-00003.gguf"), None);
        assert_eq!(parse_split_path("x-0000a-of-00003.gguf"), None);
    }
}
