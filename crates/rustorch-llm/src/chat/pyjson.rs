//! `tojson` as Hugging Face's chat-template environment defines it:
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
//!
//! Jinja2's own `tojson` (and minijinja's) escape `<`, `>`, `&` and `'` for HTML; HF replaces it
//! because chat templates print tool schemas into prompts, where those escapes would change the
//! text the model sees. Python's `json.dumps` also differs from compact JSON writers: it puts a
//! space after `,` and `:` unless indenting, and prints floats as Python's `repr` does.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

struct Style {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The `tojson` filter: `value | tojson(indent=4)`, `tojson(2)`, `sort_keys=true`, ...
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v.clone()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: indent must be a non-negative integer, not {v}"),
            )
        })?),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    // Python: separators default to (', ', ': '), or (',', ': ') when indenting.
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let style = Style {
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)`.
#[cfg(test)]
fn dumps(value: &Value, indent: Option<usize>) -> Result<String, Error> {
    let style = Style {
        indent,
        item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
        key_sep: ": ".to_string(),
        sort_keys: false,
        ensure_ascii: false,
    };
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(out)
}

fn newline(out: &mut String, style: &Style, level: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write_value(out: &mut String, v: &Value, style: &Style, level: usize) -> Result<(), Error> {
    // Deeply nested values come only from a template looping on itself; the VM's recursion
    // limit stops that before us, but a bound here keeps this function safe on its own.
    if level > 500 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                let _ = write!(out, "{i}");
            } else if v.is_integer() {
                // u64/i128 beyond i64: their Display is the decimal integer.
                let _ = write!(out, "{v}");
            } else {
                let f = f64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: cannot serialize number {v}"),
                    )
                })?;
                out.push_str(&py_float_repr(f));
            }
        }
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Bytes => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: bytes are not JSON serializable",
            ))
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, level + 1);
                write_value(out, item, style, level + 1)?;
            }
            newline(out, style, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in v.try_iter()? {
                let val = v.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    // Python turns int, float, bool and None keys into strings.
                    ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                        let mut s = String::new();
                        write_value(&mut s, &key, style, level + 1)?;
                        s
                    }
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!("tojson: keys must be str, int, float, bool or None, not {}", key.kind()),
                        ))
                    }
                };
                pairs.push((key, val));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, val)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, level + 1);
                write_str(out, key, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, val, style, level + 1)?;
            }
            newline(out, style, level);
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of kind {} is not JSON serializable", v.kind()),
            ))
        }
    }
    Ok(())
}

/// A JSON string as Python's encoder writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`; non-ASCII kept, or `\uXXXX` (surrogate pairs) with `ensure_ascii`.
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip (as Rust's formatting), written
/// positionally for decimal exponents -4..16 and as `d.ddde+XX` otherwise.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mant, exp) = sci.split_once('e').expect("{:e} output always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            s.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                s.push_str(&digits);
                s.extend(std::iter::repeat_n('0', int_len - digits.len()));
                s.push_str(".0");
            } else {
                s.push_str(&digits[..int_len]);
                s.push('.');
                s.push_str(&digits[int_len..]);
            }
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same doubles.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (2.5e-10, "2.5e-10"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn dumps_like_python() {
        let v = Value::from_pairs([
            ("name", Value::from("get_weather")),
            ("n", Value::from(3)),
            ("ok", Value::from(true)),
            ("x", Value::from(0.5)),
            ("list", Value::from(vec![Value::from(1), Value::from(())])),
            ("s", Value::from("é\"\n\u{1}<&>")),
        ]);
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(&v, None).unwrap(),
            r#"{"name": "get_weather", "n": 3, "ok": true, "x": 0.5, "list": [1, null], "s": "é\"\n\u0001<&>"}"#
        );
        // json.dumps({"a": [], "b": {"c": 1}}, indent=2)
        let v = Value::from_pairs([
            ("a", Value::from(Vec::<Value>::new())),
            ("b", Value::from_pairs([("c", Value::from(1))])),
        ]);
        assert_eq!(
            dumps(&v, Some(2)).unwrap(),
            "{\n  \"a\": [],\n  \"b\": {\n    \"c\": 1\n  }\n}"
        );
    }
}
