//! Generation from the command line: `minfer MODEL [PROMPT]` (plain, saved-session and
//! speculative runs) and `--cnv`, with the grammar and drafter flags resolved. Flag parsing is
//! `main`'s; what is printed is `minfer::cli`'s.

use super::*;

/// `choice` with its draft model's reference (a path, a cached name, `hf:`, `ollama:`) resolved
/// to a file, fetched if need be.
pub(super) fn resolve_draft(choice: crate::cli::draft::DraftChoice) -> anyhow::Result<crate::cli::draft::DraftChoice> {
    use crate::cli::draft::DraftChoice;
    Ok(match choice {
        DraftChoice::Model { path, p_min } => DraftChoice::Model {
            path: model_path(&path)?,
            p_min,
        },
        lookup => lookup,
    })
}

/// The drafter of `choice` for the loaded model; a draft model is loaded with the model's load
/// options and checked against its vocabulary.
pub(super) fn drafter(
    choice: crate::cli::draft::DraftChoice,
    args: &RunArgs,
    loaded: &crate::cli::run::Loaded,
) -> anyhow::Result<Box<dyn minfer::engine::Drafter + Send>> {
    let source = resolve_draft(choice)?
        .load(&args.load.options()?.model)
        .context("cannot load the draft model")?;
    Ok(source.drafter(loaded.model.tokenizer(), loaded.session.n_ctx())?)
}

pub(super) fn run_generate(args: RunArgs) -> anyhow::Result<()> {
    use crate::cli::run;
    // llama.cpp's `-m MODEL`: a positional argument is then the prompt.
    let mut args = args;
    if let Some(flag) = args.model_flag.take() {
        anyhow::ensure!(
            args.prompt.is_none(),
            "the model is given twice: with -m and as the first argument"
        );
        args.prompt = args.model.take().map(|p| p.to_string_lossy().into_owned());
        args.model = Some(flag);
    }
    if let Some(prompt) = args.prompt_flag.take() {
        anyhow::ensure!(
            args.prompt.is_none(),
            "the prompt is given twice: with -p and as an argument"
        );
        args.prompt = Some(prompt);
    }
    if let Some(file) = args.prompt_file.take() {
        anyhow::ensure!(
            args.prompt.is_none(),
            "the prompt is given twice: with -f and as an argument"
        );
        let text = read_text_arg(&file)?;
        args.prompt = Some(String::from_utf8(text).with_context(|| format!("{} is not UTF-8", file.display()))?);
    }
    if let Some(file) = args.system_prompt_file.take() {
        let text = read_text_arg(&file)?;
        args.system_prompt = Some(String::from_utf8(text).with_context(|| format!("{} is not UTF-8", file.display()))?);
    }
    // Escapes are processed unless --no-escape, as llama.cpp's -e is on by default.
    if !args.no_escape {
        args.prompt = args.prompt.map(|p| crate::cli::run::unescape(&p));
        args.system_prompt = args.system_prompt.map(|p| crate::cli::run::unescape(&p));
        args.stop = args.stop.iter().map(|s| crate::cli::run::unescape(s)).collect();
    }
    let color = args.color()?;
    let model = args
        .model
        .clone()
        .context("no model given (usage: minfer MODEL [PROMPT]; see --help)")?;
    if let Some(command) = mistyped_command(&model) {
        anyhow::bail!(
            "'{}' is neither a model file nor a command; did you mean `minfer {command}`?",
            model.display()
        );
    }
    // Bad flags, and grammars that do not parse, are refused before the model is read.
    let grammar_spec = args.grammar.spec()?;
    let draft_choice = args.draft.choice()?;
    let sampling = args.sampling.params()?;
    let mut options = args.load.options()?;
    // A saved session holds every layer's K and V of every token: a model's windowed layers
    // keep full regions for it (llama.cpp's --swa-full).
    options.session.swa_full |= args.session.is_some();
    let mut loaded = run::load(&model_path(&model)?, &options)?;
    let grammar = match &grammar_spec {
        Some((flag, spec)) => Some(
            loaded
                .model
                .compile_grammar(spec)
                .with_context(|| format!("{flag} cannot be used"))?,
        ),
        None => None,
    };
    if args.dump_graph.is_some() || args.dump_graph_json.is_some() {
        let tokens = run::prompt_tokens(&loaded, args.prompt.as_deref().unwrap_or("Hello"), args.no_template)?;
        let arch = loaded.session.model().arch();
        let graph = loaded
            .session
            .prepare_graph(tokens.len(), 1)
            .map_err(run::RunError::from)?;
        if let Some(path) = &args.dump_graph {
            std::fs::write(path, graph.to_dot()).with_context(|| format!("cannot write {}", path.display()))?;
        }
        if let Some(path) = &args.dump_graph_json {
            let kind = if tokens.len() == 1 { "decode" } else { "prefill" };
            let json = serde_json::to_string_pretty(&graph.to_json(arch, kind))?;
            std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }
    // llama-cli's habit: no prompt on a terminal starts a conversation (a pipe still gives
    // the prompt on standard input).
    let one_turn = args.no_cnv || args.single_turn;
    let no_prompt_on_a_terminal =
        args.prompt.is_none() && !args.no_template && !one_turn && std::io::IsTerminal::is_terminal(&std::io::stdin());
    if args.cnv || no_prompt_on_a_terminal {
        return run_conversation(args, sampling, grammar, loaded, color);
    }
    let drafter = draft_choice.map(|choice| drafter(choice, &args, &loaded)).transpose()?;
    let prompt = match args.prompt.take() {
        Some(p) => p,
        None => {
            String::from_utf8(read_text_arg(Path::new("-"))?).context("the prompt on standard input is not UTF-8")?
        }
    };
    anyhow::ensure!(
        !prompt.trim().is_empty(),
        "the prompt is empty: give one as an argument, with -p or -f, or on standard input"
    );
    let tokens = match (&args.system_prompt, args.no_template) {
        (Some(system), false) => run::chat_tokens(&loaded, Some(system), &prompt)?,
        (Some(_), true) => anyhow::bail!("--system-prompt needs the chat template: drop --no-template"),
        (None, _) => run::prompt_tokens(&loaded, &prompt, args.no_template)?,
    };
    let n_keep = match args.keep {
        None => 0,
        Some(-1) => tokens.len(),
        Some(n) => usize::try_from(n).map_err(|_| {
            anyhow::anyhow!("--keep {n} is out of range: it must be -1 (the whole prompt) or 0 or more")
        })?,
    };
    let options = minfer::engine::GenerateOptions {
        max_tokens: n_predict(args.n_predict)?,
        stop: args.stop,
        ignore_eos: args.ignore_eos,
        sampling: sampling.clone(),
        grammar,
        special: args.special,
        // -n -2 (llama.cpp's): until the context is full, so never shifted.
        context_shift: (args.context_shift && args.n_predict != -2).then_some(n_keep),
        reasoning_budget: crate::cli::reasoning::budget_of(
            &loaded.model,
            crate::args::budget_tokens(args.reasoning_budget),
            &args.reasoning_budget_message,
            !args.no_template,
            &tokens,
        ),
    };
    if !args.log_disable {
        args.sampling.say_drawn_seed(&sampling);
    }
    // A thinking model's reasoning goes to stderr (dimmed on a terminal), its answer to stdout.
    let think = crate::cli::reasoning::think_of(&loaded.model, args.reasoning_format, !args.no_template, &tokens);
    let mut stdout = crate::cli::reasoning::Reasoned::new(
        Colored::new(std::io::stdout().lock(), color),
        std::io::stderr(),
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        think,
    );
    anyhow::ensure!(
        drafter.is_none() || args.session.is_none(),
        "--session cannot be combined with speculative decoding yet"
    );
    let draft = args.draft.options();
    let result = match (&args.session, drafter) {
        (_, Some(mut drafter)) => {
            run::run_speculative(&mut loaded, drafter.as_mut(), draft, &tokens, &options, &mut stdout)?
        }
        (Some(path), None) => run::run_generation_saved(
            &mut loaded,
            &tokens,
            &options,
            path,
            &mut stdout,
            &mut std::io::stderr().lock(),
        )?,
        (None, None) => run::run_generation(&mut loaded, &tokens, &options, &mut stdout)?,
    };
    let mut stdout = stdout.finish()?.into_inner();
    // stdout carries only the generated text; a terminal gets a final newline so that the
    // timing line on stderr starts on a line of its own.
    if std::io::IsTerminal::is_terminal(&stdout) {
        stdout.write_all(b"\n")?;
    }
    stdout.flush()?;
    // Without a limit (-n -1 or -2) a full context is where the generation ends, as in
    // llama.cpp; a count that could not be reached is an error, so that a script notices.
    let unlimited = args.n_predict < 0;
    if result.stop_reason == minfer::engine::StopReason::ContextFull && unlimited && !args.log_disable {
        eprintln!(
            "generation stopped after {} tokens: the context of {} tokens is full{}",
            result.tokens.len(),
            loaded.session.n_ctx(),
            if args.n_predict == -1 {
                " (--context-shift goes on past it)"
            } else {
                " (-n -2)"
            }
        );
    }
    anyhow::ensure!(
        result.stop_reason != minfer::engine::StopReason::ContextFull || unlimited,
        "generation stopped after {} of the {} tokens -n asked for: the context of {} tokens is full (raise --n-ctx, or add --context-shift)",
        result.tokens.len(),
        args.n_predict,
        loaded.session.n_ctx()
    );
    if !args.log_disable {
        eprintln!("{}", result.stats.summary());
    }
    Ok(())
}

/// Standard output with `--color`: each piece of generated text in yellow, the colour reset
/// after it, so that what the model wrote stands apart from the prompt and the user's turns.
pub(super) struct Colored<W: Write> {
    out: W,
    on: bool,
}

impl<W: Write> Colored<W> {
    fn new(out: W, on: bool) -> Self {
        Colored { out, on }
    }

    fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> Write for Colored<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.on && !buf.is_empty() {
            self.out.write_all(b"\x1b[33m")?;
            self.out.write_all(buf)?;
            self.out.write_all(b"\x1b[0m")?;
            Ok(buf.len())
        } else {
            self.out.write(buf)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// `--cnv`: the conversation, on a line editor when a person is at the terminal, else one turn
/// per line of standard input.
pub(super) fn run_conversation(
    args: RunArgs,
    sampling: minfer::sampling::SamplingParams,
    grammar: Option<minfer::grammar::Grammar>,
    mut loaded: crate::cli::run::Loaded,
    color: bool,
) -> anyhow::Result<()> {
    use crate::cli::conversation::{run_conversation, ConversationOptions, LineSource};
    use crate::cli::terminal;
    use std::io::IsTerminal;
    let keep = match args.keep {
        None | Some(-1) => None,
        Some(n) => Some(usize::try_from(n).map_err(|_| {
            anyhow::anyhow!("--keep {n} is out of range: it must be -1 (the system prompt) or 0 or more")
        })?),
    };
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let max_tokens = n_predict(args.n_predict)?;
    if !args.log_disable {
        args.sampling.say_drawn_seed(&sampling);
    }
    let options = ConversationOptions {
        system: args.system_prompt,
        first_turn: args.prompt,
        generate: minfer::engine::GenerateOptions {
            max_tokens,
            stop: args.stop,
            ignore_eos: args.ignore_eos,
            sampling,
            grammar,
            special: args.special,
            context_shift: None,
            reasoning_budget: None,
        },
        reasoning_budget: crate::args::budget_tokens(args.reasoning_budget),
        reasoning_budget_message: args.reasoning_budget_message,
        keep,
        context_shift: args.context_shift,
        interactive,
        reasoning_format: args.reasoning_format,
        session: args.session,
    };
    terminal::install_ctrl_c().context("cannot catch Ctrl-C")?;
    let mut input: Box<dyn LineSource> = if interactive {
        Box::new(terminal::Editor::new().context("cannot start the line editor")?)
    } else {
        Box::new(terminal::Lines(std::io::stdin().lock()))
    };
    let mut stdout = Colored::new(std::io::stdout().lock(), color);
    let mut stderr = std::io::stderr().lock();
    terminal::GENERATING.store(false, std::sync::atomic::Ordering::SeqCst);
    run_conversation(
        &mut loaded,
        &options,
        &mut Generating(input.as_mut()),
        &mut stdout,
        &mut stderr,
        &terminal::INTERRUPT,
    )?;
    Ok(())
}

/// A line source that marks the time between two reads as generating, so that Ctrl-C then
/// stops the reply rather than the process.
struct Generating<'a>(&'a mut dyn crate::cli::conversation::LineSource);

impl crate::cli::conversation::LineSource for Generating<'_> {
    fn read_line(&mut self, prompt: &str) -> std::io::Result<crate::cli::conversation::Input> {
        use std::sync::atomic::Ordering::SeqCst;
        crate::cli::terminal::GENERATING.store(false, SeqCst);
        let line = self.0.read_line(prompt);
        crate::cli::terminal::GENERATING.store(true, SeqCst);
        line
    }

    fn remember(&mut self, turn: &str) {
        self.0.remember(turn);
    }
}

/// `-n`: a count, or -1 for no limit.
pub(super) fn n_predict(n: i64) -> anyhow::Result<usize> {
    match n {
        -1 | -2 => Ok(usize::MAX),
        n => usize::try_from(n).map_err(|_| {
            anyhow::anyhow!(
                "-n {n} is out of range: it must be -1 (no limit), -2 (until the context is full) or 0 or more"
            )
        }),
    }
}

/// The subcommand `model` is a typo of, when it is no file, no cache or registry reference
/// (those hold `/`, `:` or `.`) and lies within two edits of one (`serv`, `pul`, `lsit`).
fn mistyped_command(model: &Path) -> Option<String> {
    let name = model.to_str()?;
    if model.exists() || name.contains(['/', ':', '.']) || crate::args::model_path(model).is_ok_and(|p| p.exists()) {
        return None;
    }
    let command = <crate::Cli as clap::CommandFactory>::command();
    command
        .get_subcommands()
        .map(|c| c.get_name())
        .map(|c| (edit_distance(name, c), c))
        .filter(|&(d, c)| d <= 2 && d < c.len())
        .min()
        .map(|(_, c)| c.to_string())
}

/// Levenshtein distance, by characters, with an adjacent swap counting once (`lsit`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mistyped_subcommand_gets_a_did_you_mean_and_a_file_does_not() {
        assert_eq!(mistyped_command(Path::new("serv")).as_deref(), Some("serve"));
        assert_eq!(mistyped_command(Path::new("pul")).as_deref(), Some("pull"));
        assert_eq!(mistyped_command(Path::new("lsit")).as_deref(), Some("list"));
        assert_eq!(mistyped_command(Path::new("model.gguf")), None);
        assert_eq!(mistyped_command(Path::new("hf:a/b")), None);
        assert_eq!(mistyped_command(Path::new("qwen-totally-different")), None);
    }
}
