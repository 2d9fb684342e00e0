//! What the command-line surfaces print. The binary parses flags and calls these; nothing here
//! touches the terminal or exits the process.

pub mod bench;
pub mod info;
pub mod run;
pub mod tokenize;
