//! llama.cpp's flags on minfer's command line. Every flag of llama.cpp's `common/arg.cpp`
//! (llama-cli's and llama-server's, [`TABLE`], generated from llama.cpp 0c1e570) is rewritten to
//! the minfer flag that does the same, accepted with a notice where minfer already behaves as
//! asked, or refused by its own name with the reason — before clap parses, so that no
//! multi-letter single-dash flag (`-cnv`, `-jf`, `-co`) is read as a bundle of one-letter ones
//! (`-jf FILE` as `-j f`). A value is passed on glued to its flag (`--prompt=-x`), so a value
//! that looks like a flag is never read as one. `minfer bench` takes llama-bench's flags, a
//! different set ([`BENCH`]); the other subcommands take only their own.

pub use super::llama_flags_table::TABLE;

/// What minfer makes of one llama.cpp flag.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// minfer's flag of this name does what llama.cpp's does.
    To(&'static str),
    /// `-hf REPO[:QUANT]`: the model `hf:REPO[:QUANT]`.
    HfRepo,
    /// Accepted with a notice (the reason): minfer already behaves as the flag asks.
    Ignore(&'static str),
    /// Refused by name, with the reason.
    Refuse(&'static str),
}

/// One llama.cpp option: its names, whether it takes a value, and minfer's action.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// Every spelling llama.cpp accepts.
    pub names: &'static [&'static str],
    /// Whether the next argument is its value.
    pub value: bool,
    /// What minfer does with it.
    pub action: Action,
}

/// llama-bench's and llama-batched-bench's multi-letter single-dash flags that `minfer bench`
/// and `minfer batched-bench` take under long names.
pub const BENCH: &[Flag] = &[
    Flag {
        names: &["-ngl"],
        value: true,
        action: Action::To("--n-gpu-layers"),
    },
    Flag {
        names: &["-fa"],
        value: true,
        action: Action::To("--flash-attn"),
    },
    Flag {
        names: &["-ub"],
        value: true,
        action: Action::To("--ubatch-size"),
    },
    Flag {
        names: &["-ctk"],
        value: true,
        action: Action::To("--cache-type-k"),
    },
    Flag {
        names: &["-ctv"],
        value: true,
        action: Action::To("--cache-type-v"),
    },
    Flag {
        names: &["-npl"],
        value: true,
        action: Action::To("--npl"),
    },
    Flag {
        names: &["-pg"],
        value: true,
        action: Action::To("--pg"),
    },
    Flag {
        names: &["-npp"],
        value: true,
        action: Action::To("--n-prompt"),
    },
    Flag {
        names: &["-ntg"],
        value: true,
        action: Action::To("--n-gen"),
    },
    Flag {
        names: &["-oe"],
        value: true,
        action: Action::To("--output-err"),
    },
    Flag {
        names: &["-mmp"],
        value: true,
        action: Action::To("--mmap"),
    },
    Flag {
        names: &["-lm"],
        value: true,
        action: Action::To("--load-mode"),
    },
    Flag {
        names: &["-lzm"],
        value: true,
        action: Action::To("--lazy-mode"),
    },
    Flag {
        names: &["-dev"],
        value: true,
        action: Action::To("--device"),
    },
    Flag {
        names: &["-ncmoe"],
        value: true,
        action: Action::To("--n-cpu-moe"),
    },
    Flag {
        names: &["-sm"],
        value: true,
        action: Action::To("--split-mode"),
    },
    Flag {
        names: &["-mg"],
        value: true,
        action: Action::To("--main-gpu"),
    },
    Flag {
        names: &["-nkvo"],
        value: true,
        action: Action::To("--no-kv-offload"),
    },
    Flag {
        names: &["-embd"],
        value: true,
        action: Action::To("--embeddings"),
    },
    Flag {
        names: &["-ts"],
        value: true,
        action: Action::To("--tensor-split"),
    },
    Flag {
        names: &["-ot"],
        value: true,
        action: Action::To("--override-tensor"),
    },
    Flag {
        names: &["-nopo"],
        value: true,
        action: Action::To("--no-op-offload"),
    },
    Flag {
        names: &["-fitt"],
        value: true,
        action: Action::To("--fit-target"),
    },
    Flag {
        names: &["-fitc"],
        value: true,
        action: Action::To("--fit-ctx"),
    },
    Flag {
        names: &["-rpc"],
        value: true,
        action: Action::To("--rpc"),
    },
    Flag {
        names: &["-hf", "-hfr"],
        value: true,
        action: Action::To("--hf-repo"),
    },
    Flag {
        names: &["-hff"],
        value: true,
        action: Action::To("--hf-file"),
    },
    Flag {
        names: &["-hft"],
        value: true,
        action: Action::To("--hf-token"),
    },
    Flag {
        names: &["-tb"],
        value: true,
        action: Action::Refuse("minfer uses one thread count for prefill and decode (-t)"),
    },
];

/// llama.cpp flags whose meaning for `minfer serve` is not [`TABLE`]'s (which is llama-cli's):
/// looked up first for `serve`.
pub const SERVE: &[Flag] = &[
    Flag {
        names: &["--context-shift"],
        value: false,
        action: Action::Refuse(
            "minfer serve never shifts a slot's context: a generation ends where it is full, as llama-server's does by default",
        ),
    },
    Flag {
        names: &["--no-context-shift"],
        value: false,
        action: Action::Ignore("the server never shifts a slot's context"),
    },
    Flag {
        names: &["--keep"],
        value: true,
        action: Action::Ignore("the server never shifts a slot's context, so nothing is kept"),
    },
    Flag {
        names: &["-p", "--prompt", "-f", "--file"],
        value: true,
        action: Action::Ignore("the server takes its prompts in requests"),
    },
    Flag {
        names: &["-e", "--escape", "--no-escape"],
        value: false,
        action: Action::Ignore("the server reads a request's text as sent"),
    },
    Flag {
        names: &["-sp", "--special"],
        value: false,
        action: Action::Refuse("the server's replies never carry control-token text"),
    },
    Flag {
        names: &["--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file"],
        value: true,
        action: Action::Refuse(
            "minfer serve takes a grammar or JSON schema per request (grammar, json_schema, response_format)",
        ),
    },
    Flag {
        names: &["--log-disable"],
        value: false,
        action: Action::Ignore("the server's log lines go to standard error; redirect it"),
    },
    Flag {
        names: &["-v", "--verbose", "--log-verbose"],
        value: false,
        action: Action::To("--verbose"),
    },
    Flag {
        names: &["--reasoning-format"],
        value: true,
        action: Action::To("--reasoning-format"),
    },
    Flag {
        names: &["-rea", "--reasoning"],
        value: true,
        action: Action::To("--reasoning"),
    },
    Flag {
        names: &["--models-dir"],
        value: true,
        action: Action::To("--models-dir"),
    },
    Flag {
        names: &["--models-max"],
        value: true,
        action: Action::To("--models-max"),
    },
];

/// The flag spelled `name` in `table`.
pub fn find(table: &'static [Flag], name: &str) -> Option<&'static Flag> {
    table.iter().find(|f| f.names.contains(&name))
}

/// `args` (the program name first) with llama.cpp's flags rewritten for the subcommand they
/// go to: [`TABLE`] for a run (no subcommand) and `serve`, [`BENCH`] for `bench` and
/// `batched-bench`, none for the others (a subcommand is the first argument, one of
/// `subcommands`). Arguments after `--` are left alone. A refused flag is an error naming it; an
/// ignored one prints its notice on standard error once.
pub fn expand(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    subcommands: &[&str],
) -> Result<Vec<std::ffi::OsString>, String> {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let command = args.get(1).and_then(|a| a.to_str()).filter(|a| subcommands.contains(a));
    let table: &'static [Flag] = match command {
        None | Some("serve") => TABLE,
        Some("bench" | "batched-bench") => BENCH,
        Some(_) => return Ok(args),
    };
    let mut out = Vec::with_capacity(args.len());
    let serve = command == Some("serve");
    let mut rest = args.into_iter().peekable();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(rest);
            break;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (text, None),
        };
        let serve_flag = serve.then(|| find(SERVE, name)).flatten();
        let Some(flag) = serve_flag.or_else(|| find(table, name)) else {
            out.push(arg);
            continue;
        };
        // minfer's --color also stands alone (on); llama.cpp's always takes on, off or auto.
        let optional = matches!(name, "-co" | "--color");
        let mut value = || -> Result<Option<std::ffi::OsString>, String> {
            match (&inline, flag.value) {
                (Some(v), _) => Ok(Some(v.into())),
                (None, true) if optional => Ok(rest.next_if(|v| {
                    v.to_str().is_some_and(|v| {
                        matches!(
                            v.to_ascii_lowercase().as_str(),
                            "on" | "off" | "auto" | "1" | "0" | "true" | "false" | "yes" | "no"
                        )
                    })
                })),
                (None, true) => rest.next().map(Some).ok_or_else(|| format!("{name} needs a value")),
                (None, false) => Ok(None),
            }
        };
        match flag.action {
            Action::To(long) => match value()? {
                Some(v) => {
                    let mut glued = std::ffi::OsString::from(format!("{long}="));
                    glued.push(v);
                    out.push(glued);
                }
                None => out.push(long.into()),
            },
            Action::HfRepo => {
                let repo = value()?.unwrap_or_default();
                let mut model = std::ffi::OsString::from("--model=hf:");
                model.push(repo);
                out.push(model);
            }
            Action::Ignore(why) => {
                value()?;
                eprintln!("note: llama.cpp's {name} changes nothing here: {why}");
            }
            Action::Refuse(why) => return Err(format!("llama.cpp's {name} is not supported: {why}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBCOMMANDS: &[&str] = &["serve", "bench", "batched-bench", "info"];

    fn expanded(args: &[&str]) -> Result<Vec<String>, String> {
        expand(args.iter().map(|a| a.into()), SUBCOMMANDS)
            .map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn llama_cpp_flags_become_minfer_flags_with_their_values_glued_on() {
        assert_eq!(
            expanded(&["minfer", "m.gguf", "-cnv", "-sys", "Be brief.", "-n", "8", "-t", "2"]).unwrap(),
            [
                "minfer",
                "m.gguf",
                "--cnv",
                "--system-prompt=Be brief.",
                "--n-predict=8",
                "--threads=2"
            ]
        );
        assert_eq!(
            expanded(&["minfer", "serve", "-m", "m.gguf", "-np", "2", "-cb"]).unwrap(),
            ["minfer", "serve", "--model=m.gguf", "--parallel=2"]
        );
    }

    #[test]
    fn multi_letter_short_flags_are_never_read_as_bundles_or_their_values_as_flags() {
        assert_eq!(
            expanded(&["minfer", "m.gguf", "-jf", "s.json", "-co", "on", "-p", "-cnv"]).unwrap(),
            [
                "minfer",
                "m.gguf",
                "--json-schema-file=s.json",
                "--color=on",
                "--prompt=-cnv"
            ]
        );
        assert_eq!(
            expanded(&["minfer", "-hf", "ggml-org/gemma-3-270m-GGUF:Q8_0", "-st", "-no-cnv"]).unwrap(),
            [
                "minfer",
                "--model=hf:ggml-org/gemma-3-270m-GGUF:Q8_0",
                "--single-turn",
                "--no-cnv"
            ]
        );
    }

    #[test]
    fn arguments_after_a_double_dash_and_other_subcommands_flags_are_left_alone() {
        assert_eq!(
            expanded(&["minfer", "m.gguf", "--", "-cnv"]).unwrap(),
            ["minfer", "m.gguf", "--", "-cnv"]
        );
        assert_eq!(
            expanded(&["minfer", "info", "-c", "x"]).unwrap(),
            ["minfer", "info", "-c", "x"]
        );
        assert_eq!(
            expanded(&["minfer", "bench", "-m", "m.gguf", "-ngl", "0", "-p", "512"]).unwrap(),
            ["minfer", "bench", "-m", "m.gguf", "--n-gpu-layers=0", "-p", "512"]
        );
    }

    #[test]
    fn a_flag_minfer_lacks_is_refused_by_name_with_the_reason() {
        let err = expanded(&["minfer", "m.gguf", "-tb", "2"]).unwrap_err();
        assert!(err.contains("-tb") && err.contains("-t"), "{err}");
        let err = expanded(&["minfer", "serve", "m.gguf", "--lora", "a.gguf"]).unwrap_err();
        assert!(err.contains("--lora") && err.contains("LoRA"), "{err}");
        let err = expanded(&["minfer", "m.gguf", "-p"]).unwrap_err();
        assert!(err.contains("-p needs a value"), "{err}");
    }

    /// The long names (aliases too) of `command`'s flags, each with whether it takes a value.
    fn longs(command: &clap::Command) -> Vec<(String, bool)> {
        command
            .get_arguments()
            .flat_map(|a| {
                let takes = a.get_action().takes_values();
                let mut names: Vec<String> = a.get_long().into_iter().map(str::to_string).collect();
                names.extend(a.get_all_aliases().unwrap_or_default().into_iter().map(str::to_string));
                names.into_iter().map(move |n| (format!("--{n}"), takes))
            })
            .collect()
    }

    #[test]
    fn every_flag_of_llama_cpps_table_is_rewritten_to_a_flag_minfer_has_ignored_or_refused_by_name() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cli/llama_cpp_flags.jsonl");
        // Built, so that clap's own --help and --version are among the arguments.
        let mut cli = <crate::Cli as clap::CommandFactory>::command();
        cli.build();
        let serve = cli.find_subcommand("serve").unwrap().clone();
        let run_flags = longs(&cli);
        let serve_flags = longs(&serve);
        // llama-embedding's flags are `minfer embed`'s.
        let embed_flags = longs(&cli.find_subcommand("embed").unwrap().clone());
        let mut counts = [0usize; 4];
        for line in std::fs::read_to_string(fixture).unwrap().lines() {
            let option: serde_json::Value = serde_json::from_str(line).unwrap();
            for key in ["names", "negated"] {
                for name in option[key].as_array().unwrap().iter().map(|n| n.as_str().unwrap()) {
                    let flag = find(TABLE, name).unwrap_or_else(|| panic!("llama.cpp's {name} is not in the table"));
                    // The table agrees with llama.cpp on whether a value follows.
                    let takes = key == "names" && option["kind"] == "value";
                    assert_eq!(flag.value, takes, "{name}: whether it takes a value");
                    // A flag llama-server takes is one `minfer serve` takes, ignores or refuses
                    // by name, never a clap error.
                    let examples = option["examples"].as_array().unwrap();
                    if examples.is_empty() || examples.iter().any(|e| e == "server") {
                        let served = find(SERVE, name).unwrap_or(flag);
                        assert_eq!(served.value, takes, "{name}: whether it takes a value in serve");
                        if let Action::To(long) = served.action {
                            assert!(
                                serve_flags.iter().any(|(n, _)| n == long),
                                "llama-server's {name} is rewritten to {long}, which minfer serve lacks"
                            );
                        }
                    }
                    match flag.action {
                        Action::To(long) => {
                            counts[0] += 1;
                            let found: Vec<bool> = run_flags
                                .iter()
                                .chain(&serve_flags)
                                .chain(&embed_flags)
                                .filter(|(n, _)| n == long)
                                .map(|&(_, v)| v)
                                .collect();
                            assert!(!found.is_empty(), "{name} is rewritten to {long}, which minfer lacks");
                            // A value is glued on (`--x=v`): the flag must take one, and a flag
                            // without one must not be glued to the next argument.
                            assert!(
                                found.contains(&takes),
                                "{name} -> {long}: llama.cpp's takes a value: {takes}, minfer's: {found:?}"
                            );
                        }
                        Action::HfRepo => counts[1] += 1,
                        Action::Ignore(why) | Action::Refuse(why) => {
                            assert!(!why.is_empty(), "{name}: no reason");
                            counts[if matches!(flag.action, Action::Ignore(_)) { 2 } else { 3 }] += 1;
                        }
                    }
                }
            }
        }
        eprintln!(
            "llama.cpp names: {} rewritten, {} -hf, {} ignored, {} refused",
            counts[0], counts[1], counts[2], counts[3]
        );
    }

    /// `args` expanded and parsed as `main` parses them.
    fn parse(args: &[&str]) -> Result<crate::Cli, String> {
        let cli = <crate::Cli as clap::CommandFactory>::command();
        let subcommands: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        let args = expand(args.iter().map(|a| a.into()), &subcommands)?;
        <crate::Cli as clap::Parser>::try_parse_from(args).map_err(|e| e.to_string())
    }

    #[test]
    fn llama_server_flags_mean_what_they_mean_to_the_server() {
        let cli = parse(&[
            "minfer",
            "serve",
            "-m",
            "m.gguf",
            "-r",
            "User:",
            "--ignore-eos",
            "-n",
            "9",
        ])
        .unwrap();
        let Some(crate::Command::Serve(serve)) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(
            (serve.stop.as_slice(), serve.ignore_eos, serve.n_predict),
            (&["User:".to_string()][..], true, Some(9))
        );
        let refused = parse(&["minfer", "serve", "m.gguf", "--context-shift"]).err().unwrap();
        assert!(
            refused.contains("llama.cpp's --context-shift is not supported: minfer serve never shifts"),
            "{refused}"
        );
        let refused = parse(&["minfer", "serve", "m.gguf", "-jf", "s.json"]).err().unwrap();
        assert!(
            refused.contains("-jf is not supported: minfer serve takes a grammar or JSON schema per request"),
            "{refused}"
        );
        // The same flags keep llama-cli's meaning on a run.
        assert!(
            parse(&["minfer", "m.gguf", "--context-shift", "-jf", "s.json"])
                .unwrap()
                .run
                .context_shift
        );
    }

    #[test]
    fn the_issues_flags_parse_to_their_meaning() {
        let cli = parse(&[
            "minfer", "-m", "m.gguf", "-co", "on", "-st", "-sysf", "s.txt", "-sp", "-jf", "j.json", "-ngl", "99",
        ])
        .unwrap();
        let run = &cli.run;
        assert_eq!(run.model_flag.as_deref(), Some(std::path::Path::new("m.gguf")));
        assert_eq!(run.color.as_deref(), Some("on"));
        assert!(run.single_turn && run.special);
        assert_eq!(run.system_prompt_file.as_deref(), Some(std::path::Path::new("s.txt")));
        assert_eq!(
            run.grammar.json_schema_file.as_deref(),
            Some(std::path::Path::new("j.json"))
        );
        assert_eq!(run.load.model.compat.n_gpu_layers, [99]);
        let cli = parse(&["minfer", "m.gguf", "-no-cnv", "-p", "-n 5"]).unwrap();
        assert!(cli.run.no_cnv);
        assert_eq!(cli.run.prompt_flag.as_deref(), Some("-n 5"));
        let Some(crate::Command::Serve(serve)) = parse(&[
            "minfer",
            "serve",
            "-m",
            "m.gguf",
            "--alias",
            "a",
            "-np",
            "3",
            "--metrics",
            "-cb",
            "-to",
            "30",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        assert_eq!(serve.model_flag.as_deref(), Some(std::path::Path::new("m.gguf")));
        assert_eq!(
            (serve.alias.as_deref(), serve.n_slots, serve.timeout),
            (Some("a"), Some(3), Some(30.0))
        );
        let cli = parse(&["minfer", "-hf", "ggml-org/gemma-3-270m-GGUF:Q8_0"]).unwrap();
        assert_eq!(
            cli.run.model_flag.as_deref(),
            Some(std::path::Path::new("hf:ggml-org/gemma-3-270m-GGUF:Q8_0"))
        );
    }
}
