//! The terminal side of the conversation mode: a line editor with history when a person is at a
//! terminal, plain lines from standard input when not, and Ctrl-C turned into a flag while a
//! reply is generated (and into an exit otherwise).
//!
//! This file owns the SIGINT handler and the line editor; what a line means is
//! `conversation`'s.

use super::conversation::{Input, LineSource};
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};

/// Lines from a line editor (rustyline): editing, and history of this conversation's turns.
pub struct Editor(rustyline::DefaultEditor);

impl Editor {
    /// An editor on the process's terminal.
    pub fn new() -> std::io::Result<Self> {
        rustyline::DefaultEditor::new()
            .map(Editor)
            .map_err(std::io::Error::other)
    }
}

impl LineSource for Editor {
    fn read_line(&mut self, prompt: &str) -> std::io::Result<Input> {
        use rustyline::error::ReadlineError;
        match self.0.readline(prompt) {
            Ok(line) => Ok(Input::Line(line)),
            Err(ReadlineError::Interrupted) => Ok(Input::Interrupted),
            Err(ReadlineError::Eof) => Ok(Input::Eof),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    fn remember(&mut self, turn: &str) {
        let _ = self.0.add_history_entry(turn);
    }
}

/// Lines from a reader (standard input when it is not a terminal): each is one turn.
pub struct Lines<R>(pub R);

impl<R: BufRead> LineSource for Lines<R> {
    fn read_line(&mut self, _prompt: &str) -> std::io::Result<Input> {
        let mut line = String::new();
        if self.0.read_line(&mut line)? == 0 {
            return Ok(Input::Eof);
        }
        let line = line.strip_suffix('\n').unwrap_or(&line);
        Ok(Input::Line(line.strip_suffix('\r').unwrap_or(line).to_string()))
    }
}

/// Set by Ctrl-C while [`GENERATING`] is set.
pub static INTERRUPT: AtomicBool = AtomicBool::new(false);
/// Whether a reply is being generated: Ctrl-C then stops the reply instead of the process.
pub static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        INTERRUPT.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: _exit is async-signal-safe; 130 is the shell's status for death by SIGINT.
        unsafe { libc::_exit(130) };
    }
}

/// Route SIGINT to `on_sigint`. (At a line editor's prompt the terminal is in raw mode and
/// Ctrl-C arrives as a key instead, which the editor reports as [`Input::Interrupted`].)
pub fn install_ctrl_c() -> std::io::Result<()> {
    // SAFETY: a plain handler that only touches atomics or calls _exit.
    let previous = unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    if previous == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
