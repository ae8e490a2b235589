//! The study's prompt sets (files in `../shared/data/`, see its README): Alpaca instructions,
//! WMT'14 De-En sentences and CNN/DailyMail articles, each turned into one user message.

use anyhow::{bail, Context};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A dataset of the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dataset {
    /// Instruction following: `alpaca_sample.jsonl` (`instruction`, `input`).
    Alpaca,
    /// Translation: `wmt14_deen_test.jsonl` (`de`), asked into English.
    Wmt14,
    /// Summarization: `cnndm_frank_test.jsonl` (`article`).
    Cnndm,
}

impl Dataset {
    pub fn name(self) -> &'static str {
        match self {
            Self::Alpaca => "alpaca",
            Self::Wmt14 => "wmt14",
            Self::Cnndm => "cnndm",
        }
    }

    /// The paper's column title.
    pub fn title(self) -> &'static str {
        match self {
            Self::Alpaca => "Alpaca",
            Self::Wmt14 => "WMT'14 De-En",
            Self::Cnndm => "CNN-DailyMail",
        }
    }

    pub fn file_name(self) -> &'static str {
        match self {
            Self::Alpaca => "alpaca_sample.jsonl",
            Self::Wmt14 => "wmt14_deen_test.jsonl",
            Self::Cnndm => "cnndm_frank_test.jsonl",
        }
    }

    /// `data_dir/<file>`.
    pub fn path(self, data_dir: &Path) -> PathBuf {
        data_dir.join(self.file_name())
    }

    /// The user message of one record; `long` is the field that may be shortened to fit
    /// (the article; `None` for the others).
    fn message(self, v: &Value, at: &dyn Fn() -> String) -> anyhow::Result<(String, Option<String>)> {
        let field = |k: &str| -> anyhow::Result<String> {
            v.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .with_context(|| format!("{}: no string field `{k}`", at()))
        };
        Ok(match self {
            Self::Alpaca => {
                let instruction = field("instruction")?;
                let input = v.get("input").and_then(Value::as_str).unwrap_or("");
                let text = if input.trim().is_empty() { instruction } else { format!("{instruction}\n\n{input}") };
                (text, None)
            }
            Self::Wmt14 => (
                format!("Translate the following German text into English.\n\nGerman: {}\nEnglish:", field("de")?),
                None,
            ),
            Self::Cnndm => {
                ("Summarize the following news article in a few sentences.\n\n".into(), Some(field("article")?))
            }
        })
    }
}

/// One prompt: the user message, and for long documents the part that may be cut.
#[derive(Debug, Clone)]
pub struct PromptText {
    pub head: String,
    pub body: Option<String>,
}

impl PromptText {
    /// The message with the body cut to its first `words` words (all: `usize::MAX`).
    pub fn with_words(&self, words: usize) -> String {
        match &self.body {
            None => self.head.clone(),
            Some(b) => {
                let cut: Vec<&str> = b.split_whitespace().take(words).collect();
                format!("{}{}", self.head, cut.join(" "))
            }
        }
    }

    pub fn body_words(&self) -> usize {
        self.body.as_ref().map_or(0, |b| b.split_whitespace().count())
    }
}

/// The first `limit` prompts of `dataset` in `path`. A malformed line is an error naming the
/// file and line.
pub fn read_prompts(dataset: Dataset, path: &Path, limit: usize) -> anyhow::Result<Vec<PromptText>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {} prompt file {}", dataset.name(), path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if out.len() == limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not valid JSON", at()))?;
        let (head, body) = dataset.message(&v, &at)?;
        out.push(PromptText { head, body });
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_messages_and_reports_bad_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p = dir.join("a.jsonl");
        std::fs::write(
            &p,
            "{\"instruction\": \"Add\", \"input\": \"1, 2\"}\n{\"instruction\": \"Hi\", \"input\": \"\"}\n",
        )
        .unwrap();
        let v = read_prompts(Dataset::Alpaca, &p, 10).unwrap();
        assert_eq!(v[0].with_words(usize::MAX), "Add\n\n1, 2");
        assert_eq!(v[1].with_words(usize::MAX), "Hi");
        let c = dir.join("c.jsonl");
        std::fs::write(&c, "{\"article\": \"one two three four\"}\n").unwrap();
        let v = read_prompts(Dataset::Cnndm, &c, 10).unwrap();
        assert!(v[0].with_words(2).ends_with("\n\none two") && v[0].body_words() == 4);
        let e = format!("{:#}", read_prompts(Dataset::Wmt14, &p, 10).unwrap_err());
        assert!(e.contains("line 1") && e.contains("`de`"), "{e}");
        std::fs::write(&p, "{oops\n").unwrap();
        assert!(format!("{:#}", read_prompts(Dataset::Alpaca, &p, 10).unwrap_err()).contains("not valid JSON"));
    }
}
