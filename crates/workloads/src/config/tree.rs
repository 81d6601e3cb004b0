//! The config as a JSON tree before it is typed: a flag's value parsed the way a user means
//! it, and a dotted key (`policy.chunk_size`) set in the tree. A flag and a file line are the
//! same thing once here.

use serde_json::Value;

use crate::error::WorkloadError;

/// Parse a flag value the way a user means it: numbers, booleans, lists (`1,2,4`, `[1,2,4]`,
/// `(1,2,4)`), otherwise a string.
pub fn parse_value(s: &str) -> Value {
    let t = s.trim();
    let inner = t
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .or_else(|| t.strip_prefix('(').and_then(|x| x.strip_suffix(')')));
    if let Some(inner) = inner {
        let items: Vec<Value> = inner.split(',').map(str::trim).filter(|x| !x.is_empty()).map(parse_value).collect();
        return Value::Array(items);
    }
    if t.contains(',') {
        return Value::Array(t.split(',').map(parse_value).collect());
    }
    match t {
        "true" | "True" => return Value::Bool(true),
        "false" | "False" => return Value::Bool(false),
        "null" | "None" | "none" => return Value::Null,
        _ => {}
    }
    if let Ok(i) = t.parse::<i64>() {
        return Value::from(i);
    }
    if let Ok(f) = t.parse::<f64>()
        && f.is_finite()
    {
        return Value::from(f);
    }
    Value::String(t.to_string())
}

/// Set `a.b.c = value` in a JSON tree, creating objects on the way.
pub fn set_dotted(root: &mut serde_json::Map<String, Value>, key: &str, value: Value) -> Result<(), WorkloadError> {
    let bad = |msg: String| WorkloadError::Flag { flag: key.to_string(), msg };
    let mut parts = key.split('.').peekable();
    let mut cur = root;
    while let Some(p) = parts.next() {
        if p.is_empty() {
            return Err(bad("empty name segment".into()));
        }
        if parts.peek().is_none() {
            cur.insert(p.to_string(), value);
            return Ok(());
        }
        let entry = cur.entry(p.to_string()).or_insert_with(|| Value::Object(Default::default()));
        cur = entry.as_object_mut().ok_or_else(|| bad(format!("`{p}` is a value, not a group of fields")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;


    #[test]
    fn values_parse_as_meant() {
        assert_eq!(parse_value("50"), Value::from(50));
        assert_eq!(parse_value("1e-4"), Value::from(1e-4));
        assert_eq!(parse_value("true"), Value::Bool(true));
        assert_eq!(parse_value("1,2,4"), serde_json::json!([1, 2, 4]));
        assert_eq!(parse_value("(1,2,4)"), serde_json::json!([1, 2, 4]));
        assert_eq!(parse_value("[4]"), serde_json::json!([4]));
        assert_eq!(parse_value("runs/x"), Value::String("runs/x".into()));
    }
}
