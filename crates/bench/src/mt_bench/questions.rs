//! MT-Bench and Spec-Bench question files: one JSON object per line with `question_id`,
//! `category` and `turns` (one or more user turns).

use anyhow::{bail, Context};
use serde_json::Value;
use std::path::Path;

/// One benchmark question.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Question {
    /// `question_id` (or the line number when the file has none).
    pub id: String,
    /// `category` (`-` when absent).
    pub category: String,
    /// The user turns, asked in order.
    pub turns: Vec<String>,
}

/// Reads the first `limit` questions (0: all) of `path`. Every line read must be a JSON
/// object with a non-empty `turns` array of strings; a malformed line is an error naming the
/// file and line.
pub fn read_questions(path: &Path, limit: usize) -> anyhow::Result<Vec<Question>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the question file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not valid JSON", at()))?;
        let turns: Vec<String> = match v.get("turns").and_then(Value::as_array) {
            Some(a) if !a.is_empty() => a
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .with_context(|| format!("{}: `turns` must hold strings only", at()))?,
            _ => bail!("{}: no `turns` array with at least one question", at()),
        };
        let id = match v.get("question_id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => format!("line-{}", i + 1),
        };
        let category = v.get("category").and_then(Value::as_str).unwrap_or("-").to_string();
        out.push(Question { id, category, turns });
        if out.len() == limit {
            break;
        }
    }
    if out.is_empty() {
        bail!("{}: no questions", path.display());
    }
    Ok(out)
}

/// Keeps the questions of `categories` (file order), at most `limit` of each (0: all). A
/// category without a question is an error naming the file and the categories it has.
pub fn select_categories(
    all: Vec<Question>,
    categories: &[String],
    limit: usize,
    path: &Path,
) -> anyhow::Result<Vec<Question>> {
    for c in categories {
        if !all.iter().any(|q| &q.category == c) {
            let mut have: Vec<&str> = Vec::new();
            for q in &all {
                if !have.contains(&q.category.as_str()) {
                    have.push(&q.category);
                }
            }
            bail!("{}: no question of category `{c}` (categories: {})", path.display(), have.join(", "));
        }
    }
    let mut taken = vec![0usize; categories.len()];
    Ok(all
        .into_iter()
        .filter(|q| match categories.iter().position(|c| c == &q.category) {
            Some(i) if limit == 0 || taken[i] < limit => {
                taken[i] += 1;
                true
            }
            _ => false,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary `.jsonl` file holding `text`, removed when dropped.
    fn write(name: &str, text: &str) -> tempfile::TempPath {
        let f = tempfile::Builder::new().prefix(name).suffix(".jsonl").tempfile().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f.into_temp_path()
    }

    #[test]
    fn reads_ids_categories_and_both_turns() {
        let p = write(
            "ok",
            "{\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"a\", \"b\"]}\n\n{\"turns\": [\"c\"]}\n",
        );
        let q = read_questions(&p, 0).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0], Question { id: "81".into(), category: "writing".into(), turns: vec!["a".into(), "b".into()] });
        assert_eq!(q[1].id, "line-3");
        assert_eq!(read_questions(&p, 1).unwrap().len(), 1);
    }

    #[test]
    fn categories_are_selected_with_a_limit_each() {
        let q = |id: &str, c: &str| Question { id: id.into(), category: c.into(), turns: vec!["x".into()] };
        let all = vec![q("1", "a"), q("2", "b"), q("3", "a"), q("4", "c"), q("5", "b"), q("6", "a")];
        let p = Path::new("q.jsonl");
        let ids = |v: Vec<Question>| v.into_iter().map(|q| q.id).collect::<Vec<_>>();
        let cats = ["a".to_string(), "b".to_string()];
        assert_eq!(ids(select_categories(all.clone(), &cats, 0, p).unwrap()), ["1", "2", "3", "5", "6"]);
        assert_eq!(ids(select_categories(all.clone(), &cats, 1, p).unwrap()), ["1", "2"]);
        let e = select_categories(all, &["rag".to_string()], 1, p).unwrap_err().to_string();
        assert!(e.contains("q.jsonl") && e.contains("`rag`") && e.contains("(categories: a, b, c)"), "{e}");
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let p = write("bad", "{\"turns\": [\"a\"]}\n{not json\n");
        let e = format!("{:#}", read_questions(&p, 0).unwrap_err());
        assert!(e.contains("line 2") && e.contains("not valid JSON") && e.contains(&p.display().to_string()), "{e}");
        let p = write("noturns", "{\"question_id\": 1, \"turns\": []}\n");
        let e = format!("{:#}", read_questions(&p, 0).unwrap_err());
        assert!(e.contains("line 1") && e.contains("turns"), "{e}");
        let p = write("numbers", "{\"turns\": [1]}\n");
        assert!(format!("{:#}", read_questions(&p, 0).unwrap_err()).contains("strings"));
        let e = format!("{:#}", read_questions(Path::new("/nonexistent/q.jsonl"), 0).unwrap_err());
        assert!(e.contains("/nonexistent/q.jsonl"), "{e}");
    }
}
