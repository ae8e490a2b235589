//! What every benchmark run records about itself, and where it writes: the git revision, a
//! UTC timestamp, the output folder, and a Ctrl-C flag that lets a run stop between work
//! items and still write what it finished.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// `git describe`-like revision of the working tree (`<sha>` or `<sha>-dirty`), or `unknown`.
pub fn git_revision() -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(sha) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{sha}-dirty")
            } else {
                sha
            }
        }
        None => "unknown".into(),
    }
}

/// UTC time as `YYYY-MM-DDTHH-MM-SS` (safe in file names).
pub fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Creates `dir` and returns `dir/<stem>.<ext>` paths for one run's outputs.
pub fn output_paths(dir: &Path, stem: &str) -> anyhow::Result<impl Fn(&str) -> PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating the output folder {}", dir.display()))?;
    let (dir, stem) = (dir.to_path_buf(), stem.to_string());
    Ok(move |ext: &str| dir.join(format!("{stem}.{ext}")))
}

/// Set by the first Ctrl-C: the run finishes the item in hand, then writes its results. A
/// second Ctrl-C exits at once (records already written to disk stay).
#[derive(Clone)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Installs the handler (once per process; later calls share the first flag).
    pub fn install() -> Self {
        static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
        let flag = FLAG
            .get_or_init(|| {
                let flag = Arc::new(AtomicBool::new(false));
                let presses = Arc::new(AtomicUsize::new(0));
                let f = Arc::clone(&flag);
                let handler = move || {
                    if presses.fetch_add(1, Ordering::SeqCst) == 0 {
                        f.store(true, Ordering::SeqCst);
                        eprintln!(
                            "\nbench: interrupted; finishing the current item and writing the results so far (Ctrl-C again to quit now)"
                        );
                    } else {
                        std::process::exit(130);
                    }
                };
                if let Err(e) = ctrlc::set_handler(handler) {
                    eprintln!("bench: warning: cannot catch Ctrl-C ({e}); an interrupted run keeps only its records file");
                }
                flag
            })
            .clone();
        Self(flag)
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A progress bar with an ETA on stderr; when stderr is not a terminal, one plain line per
/// `every` items instead (so CI logs show progress too).
pub struct Progress {
    bar: indicatif::ProgressBar,
    plain: bool,
    every: u64,
    start: std::time::Instant,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Self {
        use std::io::IsTerminal;
        let plain = !std::io::stderr().is_terminal();
        let bar = if plain { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(total) };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} (ETA {eta}) {msg}",
            )
            .expect("a valid template"),
        );
        bar.set_prefix(what.to_string());
        bar.set_length(total);
        Self { bar, plain, every: (total / 20).max(1), start: std::time::Instant::now() }
    }

    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    pub fn inc(&self) {
        self.bar.inc(1);
        let (pos, len) = (self.bar.position(), self.bar.length().unwrap_or(0));
        if self.plain && (pos % self.every == 0 || pos == len) {
            let el = self.start.elapsed().as_secs_f64();
            let eta = if pos > 0 { el / pos as f64 * (len - pos) as f64 } else { 0.0 };
            eprintln!("{}: {pos}/{len} done, {el:.0} s elapsed, ETA {eta:.0} s", self.bar.prefix());
        }
    }

    /// Prints a line above the bar.
    pub fn println(&self, line: String) {
        if self.plain {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
