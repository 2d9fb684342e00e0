//! The conversation's `/glob PATTERN`: the files a pattern names, as llama-cli finds them —
//! `*` and `?` within one path component, `**` across them, `[a-z]` and `[!a-z]` classes —
//! under the directory the pattern starts with (the current one otherwise; `~/` is the home
//! directory), at most [`MAX_FILES`]. Only matching; reading the files is the caller's.

use std::path::{Path, PathBuf};

/// The most files one `/glob` takes (llama-cli's `FILE_GLOB_MAX_RESULTS`).
pub const MAX_FILES: usize = 100;

/// Whether `text` (a `/`-separated relative path) matches `pattern`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    matches(pattern.as_bytes(), text.as_bytes())
}

fn matches(p: &[u8], s: &[u8]) -> bool {
    match p {
        [] => s.is_empty(),
        [b'*', b'*', rest @ ..] => matches(rest, s) || (!s.is_empty() && matches(p, &s[1..])),
        [b'*', rest @ ..] => {
            // Any run within the component: stop at a separator.
            let component = s.iter().position(|&c| c == b'/').unwrap_or(s.len());
            (0..=component).any(|i| matches(rest, &s[i..]))
        }
        [b'?', rest @ ..] => matches!(s.first(), Some(&c) if c != b'/') && matches(rest, &s[1..]),
        [b'[', class @ ..] => {
            // `]` or `-` first is a literal, as in llama.cpp.
            let skip = usize::from(matches!(class.first(), Some(b']' | b'-')));
            match class[skip..].iter().position(|&c| c == b']') {
                Some(end) => {
                    let end = skip + end;
                    match s.first() {
                        Some(&c) => in_class(c, &class[..end]) && matches(&class[end + 1..], &s[1..]),
                        None => false,
                    }
                }
                // No closing bracket: `[` is itself.
                None => s.first() == Some(&b'[') && matches(class, &s[1..]),
            }
        }
        [c, rest @ ..] => s.first() == Some(c) && matches(rest, &s[1..]),
    }
}

/// Whether `c` is in the class `class` (the text between `[` and `]`).
fn in_class(c: u8, class: &[u8]) -> bool {
    let (negated, mut class) = match class {
        [b'!', rest @ ..] => (true, rest),
        _ => (false, class),
    };
    if let [first @ (b']' | b'-'), rest @ ..] = class {
        if *first == c {
            return !negated;
        }
        class = rest;
    }
    let mut matched = false;
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == b'-' {
            if (class[i]..=class[i + 2]).contains(&c) {
                matched = true;
                break;
            }
            i += 3;
        } else {
            if class[i] == c {
                matched = true;
                break;
            }
            i += 1;
        }
    }
    matched != negated
}

/// The files under `cwd` that `pattern` names, in a stable (sorted) order, at most
/// [`MAX_FILES`]; the second value says whether more matched. A directory part before the first
/// wildcard (`src/**/*.rs`) is where the walk starts; unreadable directories are skipped.
pub fn glob_files(pattern: &str, cwd: &Path) -> (Vec<PathBuf>, bool) {
    let (mut root, mut pattern) = (cwd.to_path_buf(), pattern.to_string());
    if let Some(first) = pattern.find(['!', '[', '*', '?']).filter(|&i| i > 0) {
        if let Some(slash) = pattern[..first].rfind('/') {
            let dir = &pattern[..slash];
            root = match dir.strip_prefix("~") {
                Some(rest) => std::env::var_os("HOME")
                    .map(|home| PathBuf::from(home).join(rest.trim_start_matches('/')))
                    .unwrap_or_else(|| cwd.join(dir)),
                None => cwd.join(dir),
            };
            pattern = pattern[slash + 1..].to_string();
        }
    }
    let mut found = Vec::new();
    let mut more = false;
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for path in entries.into_iter().rev() {
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .replace('\\', "/");
                if glob_match(&pattern, &rel) {
                    found.push(path);
                }
            }
        }
    }
    found.sort();
    if found.len() > MAX_FILES {
        found.truncate(MAX_FILES);
        more = true;
    }
    (found, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_llama_cpps_glob_does() {
        for (pattern, text, expected) in [
            ("*.rs", "main.rs", true),
            ("*.rs", "src/main.rs", false),
            ("**.rs", "src/main.rs", true),
            ("**/*.rs", "src/cli/glob.rs", true),
            ("src/*/glob.rs", "src/cli/glob.rs", true),
            ("?.txt", "a.txt", true),
            ("?.txt", "ab.txt", false),
            ("file[0-9].md", "file7.md", true),
            ("file[!0-9].md", "file7.md", false),
            ("file[!0-9].md", "fileX.md", true),
            ("[]x].c", "].c", true),
            ("[-x].c", "-.c", true),
            ("a[b", "a[b", true),
            ("notes", "notes", true),
            ("notes", "notes2", false),
        ] {
            assert_eq!(glob_match(pattern, text), expected, "{pattern} on {text}");
        }
    }

    #[test]
    fn files_are_found_under_the_patterns_own_directory_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.txt", "b.md", "sub/c.txt", "sub/deep/d.txt"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, name).unwrap();
        }
        let names = |pattern: &str| -> Vec<String> {
            glob_files(pattern, dir.path())
                .0
                .iter()
                .map(|p| p.strip_prefix(dir.path()).unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names("*.txt"), ["a.txt"]);
        assert_eq!(names("**.txt"), ["a.txt", "sub/c.txt", "sub/deep/d.txt"]);
        assert_eq!(names("sub/**.txt"), ["sub/c.txt", "sub/deep/d.txt"]);
        assert!(names("*.none").is_empty());
    }

    #[test]
    fn at_most_a_hundred_files_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_FILES + 5 {
            std::fs::write(dir.path().join(format!("f{i:03}.txt")), "x").unwrap();
        }
        let (files, more) = glob_files("*.txt", dir.path());
        assert_eq!((files.len(), more), (MAX_FILES, true));
    }
}
