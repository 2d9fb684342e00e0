//! Models by name on the command line: the resolution every command runs on its model argument,
//! `minfer pull REF` and `minfer list`, and the download progress they show on standard error
//! (a bar with bytes, rate and ETA on a terminal, a line per 10 % otherwise).
//!
//! What a reference means and how it is fetched is `download`'s business; this module only
//! reads the environment's configuration and shows what happens.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use minfer::download::{self, CacheEntry, Config, DownloadError, Progress};
use minfer::gguf::GgufFile;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// The local file a command's model argument names: an existing path as it is (the
/// environment is not even read), else a cached name or an `hf:`/`ollama:` reference, fetched
/// with progress on standard error if the cache lacks it.
pub fn resolve_model(arg: &Path) -> Result<PathBuf, DownloadError> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    // A name that is not UTF-8 is no reference; the loader will say the file is missing.
    let Some(reference) = arg.to_str() else {
        return Ok(arg.to_path_buf());
    };
    let config = Config::from_env()?;
    download::resolve(reference, &config, &mut StderrProgress::new())
}

/// `minfer pull REF`: fetch what the reference means now (reusing what the cache holds of it)
/// and return the local path.
pub fn pull(reference: &str) -> Result<PathBuf, DownloadError> {
    let config = Config::from_env()?;
    download::pull(reference, &config, &mut StderrProgress::new())
}

/// Download progress on standard error.
pub struct StderrProgress {
    bar: Option<ProgressBar>,
    terminal: bool,
    name: String,
    total: u64,
    /// The last tenth reported, in line mode.
    tenth: u64,
}

impl StderrProgress {
    /// A bar if standard error is a terminal, lines otherwise.
    pub fn new() -> StderrProgress {
        StderrProgress {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            name: String::new(),
            total: 0,
            tenth: 0,
        }
    }

    fn line(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
}

impl Default for StderrProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for StderrProgress {
    fn waiting(&mut self, name: &str) {
        self.line(&format!("{name}: another process is fetching it; waiting"));
    }

    fn start(&mut self, name: &str, total: u64, resumed_from: u64) {
        self.name = name.to_string();
        self.total = total;
        self.tenth = tenths(resumed_from, total);
        let resumed = if resumed_from > 0 {
            format!(", resuming at {}", human_size(resumed_from))
        } else {
            String::new()
        };
        if self.terminal {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")
                    .expect("the template is valid")
                    .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(name.to_string());
            bar.set_position(resumed_from);
            bar.reset_eta();
            self.bar = Some(bar);
            if resumed_from > 0 {
                self.line(&format!("{name}: resuming at {}", human_size(resumed_from)));
            }
        } else {
            self.line(&format!("{name}: fetching {}{resumed}", human_size(total)));
        }
    }

    fn advance(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let tenth = tenths(done, self.total);
        if tenth > self.tenth && tenth < 10 {
            self.line(&format!("{}: {}0 % ({})", self.name, tenth, human_size(done)));
        }
        self.tenth = self.tenth.max(tenth);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.line(&format!(
            "{}: {} fetched and verified",
            self.name,
            human_size(self.total)
        ));
    }
}

fn tenths(done: u64, total: u64) -> u64 {
    if total == 0 {
        10
    } else {
        (u128::from(done) * 10 / u128::from(total)) as u64
    }
}

fn human_size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `minfer list`: the models of the cache with their size, GGUF file type (from the header)
/// and source (the reference they were fetched as, or `local`).
pub fn list() -> Result<String, DownloadError> {
    let dir = download::cache::default_dir();
    let entries = download::cache::entries(&dir)?;
    Ok(render_list(&dir, &entries))
}

/// The table of `minfer list`.
pub fn render_list(dir: &Path, entries: &[CacheEntry]) -> String {
    if entries.is_empty() {
        return format!("no models in {}\n", dir.display());
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            let file_type = if e.parts < e.parts_expected {
                format!("incomplete: {} of {} parts", e.parts, e.parts_expected)
            } else {
                match GgufFile::open(&e.path) {
                    Ok(f) => f
                        .metadata()
                        .get_uint("general.file_type")
                        .map_or("unknown", super::info::file_type_name)
                        .to_string(),
                    Err(_) => "unreadable".to_string(),
                }
            };
            [
                e.name.clone(),
                human_size(e.size),
                file_type,
                e.source.clone().unwrap_or_else(|| "local".into()),
            ]
        })
        .collect();
    let header = ["NAME", "SIZE", "TYPE", "SOURCE"].map(String::from);
    let mut widths = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!("models in {}:\n", dir.display());
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(491_400_064), "468.6 MiB");
    }

    #[test]
    fn line_progress_counts_whole_tenths() {
        assert_eq!(tenths(0, 100), 0);
        assert_eq!(tenths(19, 100), 1);
        assert_eq!(tenths(100, 100), 10);
        assert_eq!(tenths(u64::MAX, u64::MAX), 10);
    }

    #[test]
    fn the_list_is_a_table_and_an_unreadable_file_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let entries = [CacheEntry {
            name: "x.gguf".into(),
            path: dir.path().join("x.gguf"),
            size: 2048,
            parts: 1,
            parts_expected: 1,
            source: Some("hf:o/r:Q8_0".into()),
        }];
        let table = render_list(dir.path(), &entries);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[1], "NAME    SIZE     TYPE        SOURCE");
        assert_eq!(lines[2], "x.gguf  2.0 KiB  unreadable  hf:o/r:Q8_0");
    }
}
