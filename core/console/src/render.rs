//! How a record's bytes are shown: JSON pretty-printed, text as text, anything
//! else as hex; long values cut at [`SHOWN_BYTES_MAX`].

use rill_client::ConsumerRecord;
use serde_json::{Value, json};

/// Most bytes of one key, value or header shown (the rest is counted, not sent).
pub(crate) const SHOWN_BYTES_MAX: usize = 16 * 1024;

/// `{"kind": "json"|"text"|"binary"|"null", "text": ..., "bytes": n, "truncated": bool}`.
pub(crate) fn bytes(b: Option<&[u8]>) -> Value {
    let Some(b) = b else {
        return json!({ "kind": "null", "text": "", "bytes": 0, "truncated": false });
    };
    let truncated = b.len() > SHOWN_BYTES_MAX;
    let shown = &b[..b.len().min(SHOWN_BYTES_MAX)];
    let (kind, text) = match std::str::from_utf8(shown) {
        Ok(s) if !truncated && looks_like_json(s) => match serde_json::from_str::<Value>(s) {
            Ok(v) => (
                "json",
                serde_json::to_string_pretty(&v).unwrap_or_else(|_| s.to_string()),
            ),
            Err(_) => ("text", s.to_string()),
        },
        Ok(s) if is_text(s) => ("text", s.to_string()),
        // A cut in the middle of a UTF-8 sequence: text up to the cut.
        Err(e) if truncated && e.error_len().is_none() && is_text(cut_text(shown, &e)) => {
            ("text", cut_text(shown, &e).to_string())
        }
        _ => ("binary", hex(shown)),
    };
    json!({ "kind": kind, "text": text, "bytes": b.len(), "truncated": truncated })
}

fn cut_text<'a>(b: &'a [u8], e: &std::str::Utf8Error) -> &'a str {
    std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default()
}

fn looks_like_json(s: &str) -> bool {
    let t = s.trim_start();
    t.starts_with('{') || t.starts_with('[')
}

/// Printable text: no control characters but tab, newline and carriage return.
fn is_text(s: &str) -> bool {
    s.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\t' | '\r'))
}

/// `0a 1b ff ...`, 16 bytes a line.
fn hex(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 3);
    for (i, byte) in b.iter().enumerate() {
        if i > 0 {
            out.push(if i % 16 == 0 { '\n' } else { ' ' });
        }
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// One record as the pages show it.
pub(crate) fn record(r: &ConsumerRecord) -> Value {
    json!({
        "partition": r.partition,
        "offset": r.offset.0,
        "timestamp_ms": r.timestamp_ms,
        "key": bytes(r.key.as_deref()),
        "value": bytes(r.value.as_deref()),
        "headers": r.headers.iter().map(|h| json!({
            "key": h.key,
            "value": bytes(Some(&h.value)),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_pretty_text_is_text_binary_is_hex() {
        let v = bytes(Some(br#"{"a":1,"b":[true]}"#));
        assert_eq!(v["kind"], "json");
        assert_eq!(v["text"], "{\n  \"a\": 1,\n  \"b\": [\n    true\n  ]\n}");
        let v = bytes(Some(b"{not json"));
        assert_eq!(v["kind"], "text");
        let v = bytes(Some("héllo\tworld\n".as_bytes()));
        assert_eq!(v["kind"], "text");
        assert_eq!(v["text"], "héllo\tworld\n");
        let v = bytes(Some(&[0, 1, 0xff]));
        assert_eq!(v["kind"], "binary");
        assert_eq!(v["text"], "00 01 ff");
        let v = bytes(None);
        assert_eq!(v["kind"], "null");
        let long: Vec<u8> = (0..40u8).collect();
        assert_eq!(
            bytes(Some(&long))["text"].as_str().unwrap().lines().count(),
            3
        );
    }

    #[test]
    fn long_values_are_cut() {
        let big = "x".repeat(SHOWN_BYTES_MAX + 10);
        let v = bytes(Some(big.as_bytes()));
        assert_eq!(v["kind"], "text");
        assert_eq!(v["truncated"], true);
        assert_eq!(v["bytes"], SHOWN_BYTES_MAX + 10);
        assert_eq!(v["text"].as_str().unwrap().len(), SHOWN_BYTES_MAX);
        // A cut inside a multi-byte character still shows text.
        let mut s = "x".repeat(SHOWN_BYTES_MAX - 1);
        s.push('é');
        let v = bytes(Some(s.as_bytes()));
        assert_eq!(v["kind"], "text");
    }
}
