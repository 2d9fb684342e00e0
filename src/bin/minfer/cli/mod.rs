//! What the command-line surfaces print. The binary parses flags and calls these; nothing here
//! exits the process, and only `terminal` touches the terminal (the line editor and Ctrl-C);
//! `pull` draws download progress on standard error.

pub mod batched_bench;
pub mod bench;
pub mod conversation;
pub mod draft;
pub mod embed;
pub mod glob;
pub mod imatrix;
pub mod info;
pub mod llama_flags;
pub mod llama_flags_table;
pub mod pull;
pub mod quantize;
pub mod reasoning;
pub mod run;
pub mod split;
pub mod terminal;
pub mod tokenize;
