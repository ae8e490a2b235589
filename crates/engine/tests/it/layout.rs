//! The engine's layout rule, checked on its sources: each top-level module imports only the
//! modules `lib.rs` allows it (the arrows run one way, so there is no import cycle), the library
//! depends on no HTTP, terminal or argument-parsing crate but behind an optional feature, and no
//! source file of the workspace runs past 700 lines without saying why at its top.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The engine's top-level modules and the ones each may import (besides `error`, which every
/// module may use, and the crate root's re-exports of it). The table of `lib.rs`.
const ALLOWED: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("kernels", &[]),
    ("model", &["kernels"]),
    ("formats", &[]),
    ("tokenizer", &["formats"]),
    ("load", &["model", "formats", "tokenizer"]),
    ("decode", &["model", "tokenizer", "kernels"]),
    ("train", &["model", "tokenizer", "kernels"]),
];

/// The root's names that are re-exports of `error` (usable everywhere).
const ROOT_ERROR_NAMES: &[&str] = &["Error", "Result", "file_error", "plain_error", "ProvisionError", "TreeError"];

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without its `#[cfg(test)]` modules and without comments (tests may reach across
/// modules; doc comments name other modules freely).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut skipping_test_module = false;
    let mut depth = 0i32;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if !skipping_test_module && trimmed == "#[cfg(test)]" {
            if let Some(next) = lines.peek() {
                if next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{') {
                    skipping_test_module = true;
                    depth = 0;
                    continue;
                }
            }
        }
        if skipping_test_module {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if depth <= 0 && line.contains('}') {
                skipping_test_module = false;
            }
            continue;
        }
        let without_comment = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

/// The top-level modules `code` names through `crate::`.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        // `$crate::` in a macro is the crate root too.
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            for name in group.split('}').next().unwrap_or("").split(',') {
                found.insert(name.trim().split("::").next().unwrap_or("").to_string());
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            found.insert(name);
        }
    }
    found.retain(|n| !n.is_empty());
    found
}

#[test]
fn engine_modules_import_only_what_the_rule_allows() {
    let src = engine_src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    let mut violations = Vec::new();
    let mut seen_modules = BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" {
            continue;
        }
        assert!(
            modules.contains(&top.as_str()),
            "{}: top-level module `{top}` is not in the layout rule",
            rel.display()
        );
        seen_modules.insert(top.clone());
        let allowed = ALLOWED.iter().find(|(m, _)| *m == top).unwrap().1;
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for name in crate_references(&code) {
            let ok = name == top
                || name == "error"
                || ROOT_ERROR_NAMES.contains(&name.as_str())
                || allowed.contains(&name.as_str());
            if !ok {
                violations.push(format!("{} imports crate::{name}", rel.display()));
            }
        }
    }
    assert_eq!(seen_modules.len(), ALLOWED.len(), "modules in the rule without sources: {seen_modules:?}");
    assert!(
        violations.is_empty(),
        "imports against the layout rule (crates/engine/src/lib.rs):\n{}",
        violations.join("\n")
    );
}

/// The check above catches what it should: a made-up file of `model` importing `decode`.
#[test]
fn the_import_check_sees_references() {
    let code = code_of(
        "use crate::decode::Generator;\nuse crate::{kernels, load::gguf};\n// crate::tokenizer in a comment\n\
         #[cfg(test)]\nmod tests {\n    use crate::formats;\n}\nfn f() { $crate::Error::Config(x) }\n",
    );
    let refs: Vec<String> = crate_references(&code).into_iter().collect();
    assert_eq!(refs, ["Error", "decode", "kernels", "load"]);
}

#[test]
fn the_library_depends_on_no_server_terminal_or_cli_crate() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    for forbidden in ["tiny_http", "ctrlc", "anyhow", "axum", "hyper", "tokio", "indicatif"] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(forbidden)),
            "the engine library depends on `{forbidden}`: that belongs to the binaries"
        );
    }
    // clap only behind the optional `clap` feature (the binaries' shared flag groups), and the
    // hub client (an HTTP client with terminal progress bars) behind `hub`.
    for optional in ["clap", "hf-hub"] {
        let dep = deps.lines().find(|l| l.trim_start().starts_with(optional)).expect(optional);
        assert!(dep.contains("optional = true"), "{dep}");
    }
}

/// Files over 700 lines say why at their top (a line beginning `Over 700 lines:` in the first
/// comment), as the style guide asks.
#[test]
fn long_files_say_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let lines = text.lines().count();
            let says_why = text.lines().take(20).any(|l| l.contains("Over 700 lines:"));
            (lines > 700 && !says_why).then(|| format!("{} ({lines} lines)", f.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 700 lines without a reason at their top: {long:?}");
}
