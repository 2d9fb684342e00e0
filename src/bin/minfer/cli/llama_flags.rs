//! llama.cpp's multi-letter single-dash flags (`-cnv`, `-sys`, `-np`, ...), which a parser of
//! ordinary flags reads as bundles of one-letter ones (`-cnv` as `-c -n -v`). They are
//! rewritten to minfer's long flags before parsing; a llama.cpp flag minfer does not have is
//! refused by name rather than misread. Later features add their flags to [`TABLE`].

/// A llama.cpp flag and what minfer makes of it.
#[derive(Clone, Copy, Debug)]
pub enum Mapping {
    /// The same flag, under this long name.
    Long(&'static str),
    /// Not available (yet): the reason, for the refusal.
    Unsupported(&'static str),
}

/// llama.cpp's multi-letter single-dash flags (llama-cli, llama-server, llama-bench).
pub const TABLE: &[(&str, Mapping)] = &[
    ("-cnv", Mapping::Long("--cnv")),
    ("-md", Mapping::Long("--model-draft")),
    ("-sys", Mapping::Long("--system-prompt")),
    ("-np", Mapping::Long("--n-slots")),
    ("-ngl", Mapping::Long("--n-gpu-layers")),
    ("-fa", Mapping::Long("--flash-attn")),
    ("-ub", Mapping::Long("--ubatch-size")),
    (
        "-tb",
        Mapping::Unsupported("minfer uses one thread count for prefill and decode (-t)"),
    ),
    ("-npl", Mapping::Long("--npl")),
    ("-pg", Mapping::Long("--pg")),
    ("-npp", Mapping::Long("--n-prompt")),
    ("-ntg", Mapping::Long("--n-gen")),
    ("-ctk", Mapping::Long("--cache-type-k")),
    ("-ctv", Mapping::Long("--cache-type-v")),
    (
        "-mli",
        Mapping::Unsupported("end a line with \\ to go on on the next one"),
    ),
];

/// `args` (the program name first) with llama.cpp's flags rewritten; arguments after `--` are
/// left alone. A flag marked unsupported is an error naming it.
pub fn expand(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    let mut out = Vec::new();
    let mut literal = false;
    for arg in args {
        if literal || arg == "--" {
            literal = true;
            out.push(arg);
            continue;
        }
        match arg.to_str().and_then(|a| TABLE.iter().find(|(flag, _)| *flag == a)) {
            Some((_, Mapping::Long(long))) => out.push((*long).into()),
            Some((flag, Mapping::Unsupported(why))) => {
                return Err(format!("llama.cpp's {flag} is not supported: {why}"));
            }
            None => out.push(arg),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: &[&str]) -> Result<Vec<String>, String> {
        expand(args.iter().map(|a| a.into())).map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn llama_cpp_flags_become_long_flags_and_the_rest_stays() {
        assert_eq!(
            expanded(&["minfer", "m.gguf", "-cnv", "-sys", "Be brief.", "-n", "8", "-t", "2"]).unwrap(),
            [
                "minfer",
                "m.gguf",
                "--cnv",
                "--system-prompt",
                "Be brief.",
                "-n",
                "8",
                "-t",
                "2"
            ]
        );
        assert_eq!(
            expanded(&["minfer", "serve", "m.gguf", "-np", "2"]).unwrap(),
            ["minfer", "serve", "m.gguf", "--n-slots", "2"]
        );
    }

    #[test]
    fn arguments_after_a_double_dash_are_left_alone() {
        assert_eq!(
            expanded(&["minfer", "m.gguf", "--", "-cnv"]).unwrap(),
            ["minfer", "m.gguf", "--", "-cnv"]
        );
    }

    #[test]
    fn a_flag_minfer_lacks_is_refused_by_name() {
        let err = expanded(&["minfer", "m.gguf", "-tb", "2"]).unwrap_err();
        assert!(err.contains("-tb"), "{err}");
    }
}
