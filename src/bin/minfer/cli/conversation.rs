//! `minfer MODEL --cnv`: llama-cli's conversation mode. A user turn is read, the whole
//! conversation is rendered with the model's chat template, only the tokens the KV cache lacks
//! are prefilled ([`TokenStream`]), the reply is streamed, and it joins the conversation; when
//! the context fills it is shifted, keeping the system prompt.
//!
//! This file owns the turns and the commands (`/exit`, `/clear`, `/help`). Where lines come from
//! (a line editor on a terminal, or standard input) and how Ctrl-C reaches the `interrupt` flag
//! are the binary's: it passes a [`LineSource`] and the flag, and the writers to print on.

use super::run::{Loaded, RunError};
use minfer::engine::{
    generate_cached, session_file, EngineError, GenerateOptions, GenerationObserver, StopReason, TokenStream,
};
use serde_json::{json, Value as Json};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// One read from the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A line, without its end of line.
    Line(String),
    /// Ctrl-C at the prompt: leave.
    Interrupted,
    /// Ctrl-D or the end of the input: leave.
    Eof,
}

/// Where the user's lines come from.
pub trait LineSource {
    /// The next line, showing `prompt` first where there is someone to see it.
    fn read_line(&mut self, prompt: &str) -> std::io::Result<Input>;

    /// Remember a whole turn for recall (a line editor's history); nothing by default.
    fn remember(&mut self, _turn: &str) {}
}

/// How the conversation runs.
#[derive(Clone, Debug)]
pub struct ConversationOptions {
    /// The system prompt (`-sys`), the first message of every conversation.
    pub system: Option<String>,
    /// The first user turn, given with `-p` or `-f`, sent before anything is read.
    pub first_turn: Option<String>,
    /// Sampling, stop strings and the token limit of each reply (`context_shift` is set here).
    pub generate: GenerateOptions,
    /// Tokens kept from the start when the context shifts; `None`: the system prompt's.
    pub keep: Option<usize>,
    /// Shift the context when it fills; otherwise a full context ends the reply, and a turn
    /// that does not fit is refused.
    pub context_shift: bool,
    /// Show the prompt (`> `) and the hints: someone is at a terminal.
    pub interactive: bool,
    /// Where a thinking model's reasoning goes (`--reasoning-format`).
    pub reasoning_format: minfer::template::reasoning::ReasoningFormat,
    /// `--reasoning-budget` (`None`: no limit) and `--reasoning-budget-message`, applied to
    /// each reply.
    pub reasoning_budget: Option<usize>,
    pub reasoning_budget_message: String,
    /// A saved session to start from when it exists, and to save after each turn.
    pub session: Option<std::path::PathBuf>,
}

/// The commands a user may type at the prompt.
pub const HELP: &str = "\
/exit        leave (also Ctrl-D, or Ctrl-C at the prompt)
/clear       start a new conversation (same system prompt)
/regen       drop the last reply and write it again
/read FILE   add the text of FILE to the next turn
/glob PAT    add the text files PAT names (`*.rs`, `src/**.md`; at most 100) to the next turn
/help        this list
A line ending with \\ goes on on the next line. Ctrl-C while a reply is written stops it;
the partial reply stays in the conversation.";

/// Runs the conversation until the user leaves. Replies go to `out`, the timing line of each
/// reply and messages to `log`. A turn that cannot run (it does not fit in the context) is
/// reported and dropped; the conversation goes on.
pub fn run_conversation(
    loaded: &mut Loaded,
    options: &ConversationOptions,
    input: &mut dyn LineSource,
    out: &mut dyn Write,
    log: &mut dyn Write,
    interrupt: &AtomicBool,
) -> Result<(), RunError> {
    let write_err = |what: &str| {
        let what = what.to_string();
        move |source| RunError::Write { what, source }
    };
    let system: Vec<Json> = options
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let mut messages = system.clone();
    let n_keep = match options.keep {
        Some(n) => n,
        None => system_tokens(loaded, &system)?,
    };
    let mut stream = TokenStream::new();
    if let Some(path) = options.session.as_deref().filter(|p| p.exists()) {
        let tokens = session_file::load(&mut loaded.session, &loaded.model, path)?;
        writeln!(log, "session {}: {} tokens loaded", path.display(), tokens.len()).map_err(write_err("the log"))?;
        stream = TokenStream::resume(tokens);
    }
    if options.interactive {
        writeln!(
            log,
            "minfer chat: Ctrl-C stops a reply; Ctrl-C or Ctrl-D at the prompt leaves; /help lists the commands."
        )
        .map_err(write_err("the log"))?;
    }
    let mut first_turn = options.first_turn.clone();
    // Files added with /read and /glob, sent with the next turn, as llama-cli sends them.
    let mut staged = String::new();
    loop {
        let turn = match first_turn.take() {
            Some(turn) => turn,
            None => match read_turn(input, options.interactive).map_err(write_err("the input"))? {
                Some(turn) => turn,
                None => return Ok(()),
            },
        };
        if turn.trim().is_empty() {
            continue;
        }
        // A command starts the line; a turn that starts with a space is text whatever follows.
        let (command, argument) = match turn.starts_with('/') {
            true => turn.trim().split_once(' ').unwrap_or((turn.trim(), "")),
            false => ("", ""),
        };
        // What the line editor's history keeps: the line typed, not the files it sends.
        let typed = turn.clone();
        let turn = match command {
            "/exit" => return Ok(()),
            "/clear" => {
                // The KV cache keeps the system prompt: the next turn's prefix matches it.
                messages = system.clone();
                staged.clear();
                continue;
            }
            "/help" => {
                writeln!(log, "{HELP}").map_err(write_err("the log"))?;
                continue;
            }
            "/regen" => {
                // The last reply goes; its user turn is written to again.
                match messages.last() {
                    Some(m) if m["role"] == "assistant" => {
                        messages.pop();
                        match messages.pop() {
                            Some(user) => user["content"].as_str().unwrap_or_default().to_string(),
                            None => continue,
                        }
                    }
                    _ => {
                        writeln!(log, "error: /regen: there is no reply to write again")
                            .map_err(write_err("the log"))?;
                        continue;
                    }
                }
            }
            "/read" | "/glob" if argument.trim().is_empty() => {
                writeln!(log, "error: {command} needs a file name or pattern").map_err(write_err("the log"))?;
                continue;
            }
            "/read" => {
                let line = stage_file(&mut staged, std::path::Path::new(argument.trim()));
                writeln!(log, "{line}").map_err(write_err("the log"))?;
                continue;
            }
            "/glob" => {
                let cwd = std::env::current_dir().unwrap_or_default();
                let (files, more) = super::glob::glob_files(argument.trim(), &cwd);
                let mut lines: Vec<String> = files.iter().map(|f| stage_file(&mut staged, f)).collect();
                if files.is_empty() {
                    lines.push(format!("error: /glob {}: no file matches", argument.trim()));
                }
                if more {
                    lines.push(format!(
                        "error: /glob takes at most {} files; the rest are left out",
                        super::glob::MAX_FILES
                    ));
                }
                writeln!(log, "{}", lines.join("\n")).map_err(write_err("the log"))?;
                continue;
            }
            c if c.starts_with('/') && !c[1..].contains('/') => {
                // Never a user turn: a mistyped command would go to the model.
                writeln!(log, "error: unknown command {c}; /help lists the commands (start a turn with a space to send it as text)")
                    .map_err(write_err("the log"))?;
                continue;
            }
            _ => std::mem::take(&mut staged) + &turn,
        };
        input.remember(if command.is_empty() { &typed } else { &turn });
        messages.push(json!({"role": "user", "content": turn}));
        let text = loaded
            .model
            .template()
            .render(&messages, None, true, &Default::default())?;
        let tokens = loaded.model.encode(&text);
        let prepared = match stream.prepare(&mut loaded.session, &tokens, n_keep, options.context_shift) {
            Ok(p) => p,
            Err(e @ EngineError::ContextFull { .. }) => {
                messages.pop();
                writeln!(log, "error: this turn does not fit: {e}").map_err(write_err("the log"))?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let generate = GenerateOptions {
            context_shift: options.context_shift.then_some(n_keep),
            reasoning_budget: super::reasoning::budget_of(
                &loaded.model,
                options.reasoning_budget,
                &options.reasoning_budget_message,
                true,
                &prepared.prompt,
            ),
            ..options.generate.clone()
        };
        interrupt.store(false, Ordering::SeqCst);
        // A thinking model's reasoning goes to the log, dimmed for a person at the terminal;
        // the turn kept in the conversation is the answer.
        let think = super::reasoning::think_of(&loaded.model, options.reasoning_format, true, &prepared.prompt);
        let mut reply = Reply {
            out: super::reasoning::Reasoned::new(&mut *out, &mut *log, options.interactive, think),
            interrupt,
        };
        let result = generate_cached(
            &mut loaded.session,
            loaded.model.tokenizer(),
            &prepared.prompt,
            prepared.n_cached,
            &generate,
            &mut reply,
        );
        reply.out.end().map_err(write_err("the reply"))?;
        let text = String::from_utf8_lossy(reply.out.content()).into_owned();
        out.write_all(b"\n")
            .and_then(|()| out.flush())
            .map_err(write_err("the reply"))?;
        match result {
            Ok(result) => {
                stream.record(&loaded.session, result.stats.n_discarded);
                messages.push(json!({"role": "assistant", "content": text}));
                let note = match result.stop_reason {
                    StopReason::Interrupted => " | interrupted",
                    StopReason::ContextFull => " | the context is full",
                    _ => "",
                };
                let cached = format!(" | Cached: {} tokens", prepared.n_cached);
                // One write for the whole line: an unbuffered log would otherwise let a reader see
                // the summary without the rest.
                let line = format!("{}{cached}{note}\n", result.stats.summary());
                log.write_all(line.as_bytes()).map_err(write_err("the log"))?;
                if let Some(path) = &options.session {
                    session_file::save(&mut loaded.session, &loaded.model, path)?;
                    // Saving packs the cache; the stream's window is unchanged.
                }
            }
            // Ctrl-C while the prompt was being read: the turn is dropped, and the cache, which
            // holds part of it, starts over.
            Err(EngineError::Output(_)) if interrupt.load(Ordering::SeqCst) => {
                messages.pop();
                loaded.session.reset();
                stream.clear();
                writeln!(log, "interrupted while reading the prompt; the turn is dropped")
                    .map_err(write_err("the log"))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The tokens the system prompt alone renders to, when they begin every rendering (what a
/// context shift keeps by default); 0 without a system prompt.
fn system_tokens(loaded: &Loaded, system: &[Json]) -> Result<usize, RunError> {
    if system.is_empty() {
        return Ok(0);
    }
    let alone = loaded
        .model
        .template()
        .render(system, None, false, &Default::default())?;
    let with_turn = loaded.model.template().render(
        &[system[0].clone(), json!({"role": "user", "content": "x"})],
        None,
        true,
        &Default::default(),
    )?;
    let (alone, with_turn) = (loaded.model.encode(&alone), loaded.model.encode(&with_turn));
    Ok(alone.iter().zip(&with_turn).take_while(|(a, b)| a == b).count())
}

/// A whole turn: lines ending with `\` go on on the next one. `None`: the user left.
fn read_turn(input: &mut dyn LineSource, interactive: bool) -> std::io::Result<Option<String>> {
    let mut turn = String::new();
    let mut prompt = if interactive { "> " } else { "" };
    loop {
        match input.read_line(prompt)? {
            Input::Line(line) => match line.strip_suffix('\\') {
                Some(head) => {
                    turn.push_str(head);
                    turn.push('\n');
                    prompt = if interactive { "... " } else { "" };
                }
                None => {
                    turn.push_str(&line);
                    return Ok(Some(turn));
                }
            },
            Input::Interrupted | Input::Eof => return Ok(None),
        }
    }
}

/// Streams the reply and keeps its text; stops when the user presses Ctrl-C.
struct Reply<'a> {
    /// The answer to the terminal (and kept), the reasoning to the log.
    out: super::reasoning::Reasoned<&'a mut dyn Write, &'a mut dyn Write>,
    interrupt: &'a AtomicBool,
}

impl GenerationObserver for Reply<'_> {
    fn on_text(&mut self, text: &[u8]) -> Result<(), String> {
        self.out
            .write_all(text)
            .and_then(|()| self.out.flush())
            .map_err(|e| e.to_string())
    }

    fn cancelled(&self) -> bool {
        self.interrupt.load(Ordering::SeqCst)
    }

    fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::SeqCst)
    }
}

/// Adds the text of `path` to the next turn as llama-cli does (`--- File: NAME ---` and the
/// text), and says so; a file that cannot be read (or is not text) adds nothing and says why.
fn stage_file(staged: &mut String, path: &std::path::Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            staged.push_str(&format!("--- File: {} ---\n{text}", path.display()));
            format!("added {} to the next turn ({} bytes)", path.display(), text.len())
        }
        Err(e) => format!("error: cannot read {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Script(std::vec::IntoIter<Input>);

    impl LineSource for Script {
        fn read_line(&mut self, _prompt: &str) -> std::io::Result<Input> {
            Ok(self.0.next().unwrap_or(Input::Eof))
        }
    }

    fn script(lines: &[&str]) -> Script {
        Script(
            lines
                .iter()
                .map(|l| Input::Line(l.to_string()))
                .collect::<Vec<_>>()
                .into_iter(),
        )
    }

    #[test]
    fn a_line_ending_with_a_backslash_goes_on_on_the_next_one() {
        let mut input = script(&["first\\", "second\\", "third", "next"]);
        assert_eq!(
            read_turn(&mut input, false).unwrap().as_deref(),
            Some("first\nsecond\nthird")
        );
        assert_eq!(read_turn(&mut input, false).unwrap().as_deref(), Some("next"));
        assert_eq!(read_turn(&mut input, false).unwrap(), None);
    }
}
