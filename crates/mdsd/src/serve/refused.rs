//! Request fields `mdsd serve` refuses rather than ignores: each would change what the answer
//! is (its law, its length or its form), so ignoring it would hand back something else than
//! asked for. A field at its neutral value (absent, `null`, 0, 1, empty) passes.

use serde_json::Value;

/// A refused field: its name, the test of its neutral value, and why it is refused.
type Refused = (&'static str, fn(&Value) -> bool, &'static str);

/// The refused fields.
const REFUSED: [Refused; 8] = [
    ("min_tokens", is_zero, "a minimum length is not implemented"),
    ("best_of", is_one, "best-of selection is not implemented"),
    ("suffix", is_empty, "insertion after a suffix is not implemented"),
    ("response_format", is_text_format, "constrained (JSON) output is not implemented"),
    ("tools", is_empty, "tool calls are not implemented"),
    ("functions", is_empty, "function calls are not implemented"),
    ("guided_json", Value::is_null, "guided decoding is not implemented"),
    ("guided_regex", Value::is_null, "guided decoding is not implemented"),
];

/// The first refused field a request sets to a value other than its neutral one, as a message.
pub(super) fn refused_field(body: &Value) -> Option<String> {
    REFUSED.iter().find_map(|&(name, neutral, why)| match body.get(name) {
        Some(v) if !neutral(v) => Some(format!("{name}: not supported: {why}")),
        _ => None,
    })
}

fn is_zero(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(0.0)
}

fn is_one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn is_text_format(v: &Value) -> bool {
    v.is_null() || v.get("type").and_then(Value::as_str) == Some("text")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn neutral_values_pass_and_others_are_named() {
        let neutral = json!({"best_of": 1, "suffix": "", "response_format": {"type": "text"},
            "tools": [], "functions": null, "guided_json": null, "model": "x", "user": "y"});
        assert_eq!(refused_field(&neutral), None);
        for (field, value) in [
            ("min_tokens", json!(3)),
            ("best_of", json!(3)),
            ("suffix", json!("}")),
            ("response_format", json!({"type": "json_object"})),
            ("tools", json!([{"type": "function"}])),
            ("guided_regex", json!("[a-z]+")),
        ] {
            let mut body = neutral.clone();
            body[field] = value;
            let msg = refused_field(&body).unwrap_or_else(|| panic!("{field} passed"));
            assert!(msg.starts_with(&format!("{field}: not supported")), "{msg}");
        }
    }
}
