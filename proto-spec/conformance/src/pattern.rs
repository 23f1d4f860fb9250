//! What the vectors say must come back, matched by shape, and the variables steps fill in.
//!
//! A pattern is JSON. An object matches an object that has every key it names, each matching
//! (other keys may be there); an array matches an array of the same length, element by
//! element; anything else must be equal. Strings starting with `$` are matchers:
//! `$any` (present, any value), `$absent` (as an object's value: the key is missing or null),
//! `$int`, `$number`, `$string`, `$bool`, `$array`, `$object`, `$nonEmpty` (a non-empty string
//! or array). Objects with one `$` key are matchers too: `{"$gt": n}`, `{"$gte": n}`,
//! `{"$len": n}` (an array or string of that length), `{"$contains": [p, …]}` (an array with
//! an element matching each), `{"$oneOf": [p, …]}` (matching one of them),
//! `{"$startsWith": "…"}`.
//!
//! Before a step is sent or matched, `${name}` is replaced by the variable `name` (the whole
//! string: by its JSON value; inside a longer string: by its text), and
//! `{"$repeat": [text, n]}` by `text` repeated `n` times.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// The variables of one case: the agents' ids, the case's conversation ids, what steps saved.
pub type Vars = HashMap<String, Value>;

/// `value` with every `${name}` and `$repeat` filled in.
pub fn fill(value: &Value, vars: &Vars) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => fill_str(s, vars)?,
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| fill(v, vars))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => {
            if let Some(Value::Array(args)) = map.get("$repeat").filter(|_| map.len() == 1) {
                let (Some(text), Some(n)) = (
                    args.first().and_then(Value::as_str),
                    args.get(1).and_then(Value::as_u64),
                ) else {
                    return Err("$repeat takes [text, count]".into());
                };
                return Ok(Value::String(text.repeat(n as usize)));
            }
            let mut out = Map::new();
            for (k, v) in map {
                // Keys too: `cursors: {"${conv}": 2}`.
                let key = match fill_str(k, vars)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                out.insert(key, fill(v, vars)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

fn fill_str(s: &str, vars: &Vars) -> Result<Value, String> {
    if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        if !name.contains("${") {
            return vars
                .get(name)
                .cloned()
                .ok_or_else(|| format!("no variable {name}"));
        }
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            return Err(format!("unclosed ${{ in {s:?}"));
        };
        let name = &rest[start + 2..start + end];
        match vars.get(name) {
            Some(Value::String(v)) => out.push_str(v),
            Some(v) => out.push_str(&v.to_string()),
            None => return Err(format!("no variable {name}")),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

/// Whether `actual` matches `pattern`; the path of the first mismatch and why, when not.
pub fn check(pattern: &Value, actual: Option<&Value>, path: &str) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "at {}: {why}",
            if path.is_empty() { "$" } else { path }
        ))
    };
    match pattern {
        Value::String(m) if m.starts_with('$') => {
            let ok = match (m.as_str(), actual) {
                ("$absent", a) => a.is_none_or(Value::is_null),
                (_, None) => return fail(format!("missing (expected {m})")),
                ("$any", Some(_)) => true,
                ("$int", Some(a)) => a.is_i64() || a.is_u64(),
                ("$number", Some(a)) => a.is_number(),
                ("$string", Some(a)) => a.is_string(),
                ("$bool", Some(a)) => a.is_boolean(),
                ("$array", Some(a)) => a.is_array(),
                ("$object", Some(a)) => a.is_object(),
                ("$nonEmpty", Some(a)) => {
                    a.as_str().is_some_and(|s| !s.is_empty())
                        || a.as_array().is_some_and(|v| !v.is_empty())
                }
                // A literal string that starts with `$`.
                (_, Some(a)) => a.as_str() == Some(m.as_str()),
            };
            if ok {
                Ok(())
            } else {
                fail(format!("{} does not match {m}", show(actual)))
            }
        }
        Value::Object(p) if p.len() == 1 && p.keys().all(|k| k.starts_with('$')) => {
            matcher(p, actual, path)
        }
        Value::Object(p) => {
            let Some(Value::Object(a)) = actual else {
                return fail(format!("expected an object, got {}", show(actual)));
            };
            for (k, sub) in p {
                check(sub, a.get(k), &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        Value::Array(p) => {
            let Some(Value::Array(a)) = actual else {
                return fail(format!("expected an array, got {}", show(actual)));
            };
            if a.len() != p.len() {
                return fail(format!(
                    "expected {} elements, got {}: {}",
                    p.len(),
                    a.len(),
                    show(actual)
                ));
            }
            for (i, (sub, item)) in p.iter().zip(a).enumerate() {
                check(sub, Some(item), &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        literal => {
            if actual == Some(literal) {
                Ok(())
            } else {
                fail(format!("expected {literal}, got {}", show(actual)))
            }
        }
    }
}

fn matcher(p: &Map<String, Value>, actual: Option<&Value>, path: &str) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "at {}: {why}",
            if path.is_empty() { "$" } else { path }
        ))
    };
    let Some((op, arg)) = p.iter().next() else {
        return Ok(());
    };
    let Some(a) = actual else {
        return fail(format!("missing (expected {op} {arg})"));
    };
    let number = |v: &Value| v.as_f64();
    let ok = match op.as_str() {
        "$gt" => number(a).zip(number(arg)).is_some_and(|(a, b)| a > b),
        "$gte" => number(a).zip(number(arg)).is_some_and(|(a, b)| a >= b),
        "$len" => {
            let len = a
                .as_array()
                .map(Vec::len)
                .or_else(|| a.as_str().map(|s| s.chars().count()));
            len.map(|l| l as u64) == arg.as_u64()
        }
        "$startsWith" => a
            .as_str()
            .zip(arg.as_str())
            .is_some_and(|(a, b)| a.starts_with(b)),
        "$contains" => {
            let (Some(items), Some(wanted)) = (a.as_array(), arg.as_array()) else {
                return fail(format!("$contains needs arrays, got {}", show(actual)));
            };
            for w in wanted {
                if !items.iter().any(|i| check(w, Some(i), "").is_ok()) {
                    return fail(format!("no element matches {w} in {}", show(actual)));
                }
            }
            true
        }
        "$oneOf" => arg
            .as_array()
            .is_some_and(|alts| alts.iter().any(|alt| check(alt, Some(a), "").is_ok())),
        other => return fail(format!("unknown matcher {other}")),
    };
    if ok {
        Ok(())
    } else {
        fail(format!("{} does not match {op} {arg}", show(actual)))
    }
}

/// The value at `path` (`result.event.seq`, `error.data.currentTurn`, `items[0]`).
pub fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = value;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, index) = match part.find('[') {
            Some(i) => (
                &part[..i],
                part[i + 1..].strip_suffix(']')?.parse::<usize>().ok(),
            ),
            None => (part, None),
        };
        if !key.is_empty() {
            cur = cur.get(key)?;
        }
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => {
            let s = v.to_string();
            if s.len() > 300 {
                let cut = (0..=300)
                    .rev()
                    .find(|&i| s.is_char_boundary(i))
                    .unwrap_or(0);
                format!("{}… ({} bytes)", &s[..cut], s.len())
            } else {
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_matchers_and_variables() {
        let actual = json!({"seq": 3, "turn": 2, "duplicate": false, "extra": [1, 2]});
        assert!(check(
            &json!({"seq": "$int", "duplicate": false}),
            Some(&actual),
            ""
        )
        .is_ok());
        assert!(check(&json!({"seq": {"$gt": 3}}), Some(&actual), "").is_err());
        assert!(check(
            &json!({"missing": "$absent", "extra": {"$len": 2}}),
            Some(&actual),
            ""
        )
        .is_ok());
        let e = check(&json!({"seq": 4}), Some(&actual), "result").unwrap_err();
        assert_eq!(e, "at result.seq: expected 4, got 3");
        assert!(check(&json!({"extra": {"$contains": [2]}}), Some(&actual), "").is_ok());
        assert!(check(&json!([1]), Some(&json!([1, 2])), "").is_err());
        let vars: Vars = [
            ("conv".to_string(), json!("c-1")),
            ("n".to_string(), json!(7)),
        ]
        .into();
        assert_eq!(
            fill(
                &json!({"id": "${conv}", "text": "at ${n} in ${conv}", "n": "${n}", "${conv}": 1}),
                &vars
            )
            .unwrap(),
            json!({"id": "c-1", "text": "at 7 in c-1", "n": 7, "c-1": 1})
        );
        assert_eq!(
            fill(&json!({"$repeat": ["ab", 3]}), &vars).unwrap(),
            json!("ababab")
        );
        assert!(fill(&json!("${nope}"), &vars).is_err());
        assert_eq!(at(&json!({"a": {"b": [5, 6]}}), "a.b[1]"), Some(&json!(6)));
    }
}
