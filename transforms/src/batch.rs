//! A batch as it crosses the WebAssembly boundary (contract 0.2.0): the input
//! records of one partition laid out as spans into one byte buffer, and a
//! module's output batch checked and turned into records whose keys, values and
//! header values share one buffer (`Bytes` slices, no copy per field).
//!
//! Invariants of a [`Processed`] (checked in [`decode`], so the runner can rely
//! on them): one result per input record, in order; the outputs are in input
//! order, a record's `Ok(n)` owning the next `n` of them; a failed record has
//! no outputs; every span lies inside the data and every header key is UTF-8.
//! An output batch that breaks the contract is refused as a whole, with a
//! message naming what was wrong. [`decode_v0_1`] gives the same for modules
//! built for contract 0.1.0.

use bytes::Bytes;
use rill_client::{ConsumerRecord, Header};

use crate::wit::{self, InputBatch, OutputBatch, Span};

/// One record a transform made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransformOutput {
    /// One of the deployment's outputs; `None` is the first.
    pub topic: Option<String>,
    pub key: Option<Bytes>,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Room for one more header is reserved (the runner adds the origin).
    pub headers: Vec<Header>,
}

/// What a call (or several, one record at a time) made of its input records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processed {
    /// The outputs of every successful record, in input order.
    pub outputs: Vec<TransformOutput>,
    /// Per input record, in order: how many of `outputs` are its own, or why it
    /// failed. Shorter than the input when processing stopped at a failure.
    pub results: Vec<Result<usize, String>>,
}

impl Processed {
    /// Every one of `records` failed with `message`.
    pub fn all_failed(records: usize, message: &str) -> Processed {
        Processed {
            outputs: Vec::new(),
            results: vec![Err(message.to_string()); records],
        }
    }

    pub fn all_ok(&self) -> bool {
        self.results.iter().all(Result::is_ok)
    }

    /// Appends the results of a later call (the records after this one's).
    pub fn append(&mut self, mut later: Processed) {
        self.outputs.append(&mut later.outputs);
        self.results.append(&mut later.results);
    }
}

/// The input side of a call; its buffers are kept between calls.
#[derive(Debug, Default)]
pub struct InputBuffer {
    records: Vec<wit::InputRecord>,
    headers: Vec<wit::Header>,
    data: Vec<u8>,
}

impl InputBuffer {
    /// Lays out `records` (of one partition, in offset order).
    pub fn fill(&mut self, records: &[ConsumerRecord]) {
        self.records.clear();
        self.headers.clear();
        self.data.clear();
        for r in records {
            let first_header = self.headers.len() as u32;
            for h in &r.headers {
                let key = push(&mut self.data, h.key.as_bytes());
                let value = push(&mut self.data, &h.value);
                self.headers.push(wit::Header { key, value });
            }
            let key = r.key.as_deref().map(|k| push(&mut self.data, k));
            let value = r.value.as_deref().map(|v| push(&mut self.data, v));
            self.records.push(wit::InputRecord {
                offset: r.offset.0,
                timestamp_ms: r.timestamp_ms,
                key,
                value,
                first_header,
                header_count: r.headers.len() as u32,
            });
        }
    }

    /// The records as the call borrows them.
    pub fn batch<'a>(&'a self, topic: &'a str, partition: u32) -> InputBatch<'a> {
        InputBatch {
            topic,
            partition,
            records: &self.records,
            headers: &self.headers,
            data: &self.data,
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

fn push(data: &mut Vec<u8>, bytes: &[u8]) -> Span {
    let start = data.len() as u32;
    data.extend_from_slice(bytes);
    Span {
        start,
        len: bytes.len() as u32,
    }
}

/// Checks a module's answer to a call with `inputs` records and turns it into
/// records; an Err says how the answer breaks the contract.
pub fn decode(out: OutputBatch, inputs: usize) -> Result<Processed, String> {
    let data = Bytes::from(out.data);
    let slice = |s: Span, what: &str| -> Result<Bytes, String> {
        let start = s.start as usize;
        let end = start + s.len as usize;
        if end > data.len() {
            return Err(format!(
                "{what} span {start}..{end} lies outside the batch's {} data bytes",
                data.len()
            ));
        }
        Ok(data.slice(start..end))
    };
    let mut results: Vec<Result<usize, String>> = vec![Ok(0); inputs];
    let mut outputs = Vec::with_capacity(out.records.len());
    let mut last_input = 0;
    for (i, o) in out.records.into_iter().enumerate() {
        let input = o.input as usize;
        if input >= inputs {
            return Err(format!(
                "output {i} names input record {input}, but the batch has {inputs}"
            ));
        }
        if input < last_input {
            return Err(format!(
                "output {i} names input record {input} after outputs of record {last_input} (outputs must be in input order)"
            ));
        }
        last_input = input;
        if let Ok(n) = &mut results[input] {
            *n += 1;
        }
        let first = o.first_header as usize;
        let Some(spans) = first
            .checked_add(o.header_count as usize)
            .and_then(|end| out.headers.get(first..end))
        else {
            return Err(format!(
                "output {i} names headers {first}..{} of {}",
                first as u64 + o.header_count as u64,
                out.headers.len()
            ));
        };
        let mut headers = Vec::with_capacity(spans.len() + 1);
        for h in spans {
            let key = slice(h.key, "a header key")?;
            let key = String::from_utf8(key.to_vec())
                .map_err(|_| format!("output {i} has a header key that is not UTF-8"))?;
            headers.push(Header {
                key,
                value: slice(h.value, "a header value")?,
            });
        }
        outputs.push(TransformOutput {
            topic: o.topic,
            key: o.key.map(|s| slice(s, "a key")).transpose()?,
            value: o.value.map(|s| slice(s, "a value")).transpose()?,
            headers,
        });
    }
    for f in out.failures {
        let input = f.input as usize;
        match results.get_mut(input) {
            None => {
                return Err(format!(
                    "a failure names input record {input}, but the batch has {inputs}"
                ));
            }
            Some(Ok(0)) | Some(Err(_)) => results[input] = Err(f.message),
            Some(Ok(n)) => {
                return Err(format!(
                    "input record {input} both failed ({}) and made {n} outputs",
                    f.message
                ));
            }
        }
    }
    Ok(Processed { outputs, results })
}

/// Checks a 0.1.0 module's answer (one result per input record, each field
/// its own allocation) and turns it into records.
pub fn decode_v0_1(
    results: Vec<Result<Vec<wit::v0_1::OutputRecord>, String>>,
    inputs: usize,
) -> Result<Processed, String> {
    if results.len() != inputs {
        return Err(format!(
            "the module returned {} results for {inputs} records (the contract wants one per record)",
            results.len()
        ));
    }
    let mut p = Processed {
        outputs: Vec::with_capacity(inputs),
        results: Vec::with_capacity(inputs),
    };
    for result in results {
        let Ok(outputs) = result else {
            p.results.push(result.map(|_| 0));
            continue;
        };
        p.results.push(Ok(outputs.len()));
        for o in outputs {
            let mut headers = Vec::with_capacity(o.headers.len() + 1);
            headers.extend(o.headers.into_iter().map(|h| Header {
                key: h.key,
                value: Bytes::from(h.value),
            }));
            p.outputs.push(TransformOutput {
                topic: o.topic,
                key: o.key.map(Bytes::from),
                value: o.value.map(Bytes::from),
                headers,
            });
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wit::{Failure, OutputRecord};

    fn span(start: u32, len: u32) -> Span {
        Span { start, len }
    }

    fn output(input: u32, value: Option<Span>) -> OutputRecord {
        OutputRecord {
            input,
            topic: None,
            key: None,
            value,
            first_header: 0,
            header_count: 0,
        }
    }

    fn batch(records: Vec<OutputRecord>, failures: Vec<Failure>) -> OutputBatch {
        OutputBatch {
            records,
            headers: vec![wit::Header {
                key: span(0, 1),
                value: span(1, 2),
            }],
            data: b"hxyabc".to_vec(),
            failures,
        }
    }

    #[test]
    fn outputs_share_the_data_and_count_per_input() {
        let mut with_header = output(2, Some(span(3, 3)));
        with_header.header_count = 1;
        with_header.key = Some(span(0, 0));
        let p = decode(
            batch(
                vec![output(0, Some(span(3, 1))), output(0, None), with_header],
                vec![Failure {
                    input: 1,
                    message: "no".into(),
                }],
            ),
            4,
        )
        .unwrap();
        assert_eq!(p.results, vec![Ok(2), Err("no".into()), Ok(1), Ok(0)]);
        assert_eq!(p.outputs[0].value.as_deref(), Some(&b"a"[..]));
        assert_eq!(p.outputs[1].value, None, "a tombstone stays one");
        assert_eq!(p.outputs[2].value.as_deref(), Some(&b"abc"[..]));
        assert_eq!(p.outputs[2].key.as_deref(), Some(&b""[..]));
        assert_eq!(p.outputs[2].headers[0].key, "h");
        assert_eq!(&p.outputs[2].headers[0].value[..], b"xy");
        assert!(p.outputs[2].headers.capacity() >= 2, "room for the origin");
    }

    #[test]
    fn refuses_answers_that_break_the_contract_by_name() {
        let e = |records, failures| decode(batch(records, failures), 2).unwrap_err();
        assert!(e(vec![output(2, None)], vec![]).contains("names input record 2"));
        assert!(e(vec![output(1, None), output(0, None)], vec![]).contains("input order"));
        assert!(e(vec![output(0, Some(span(4, 9)))], vec![]).contains("outside"));
        let mut bad_headers = output(0, None);
        bad_headers.first_header = 1;
        bad_headers.header_count = 1;
        assert!(e(vec![bad_headers], vec![]).contains("headers 1..2 of 1"));
        let fail = |input| Failure {
            input,
            message: "x".into(),
        };
        assert!(e(vec![], vec![fail(5)]).contains("failure names input record 5"));
        assert!(e(vec![output(0, None)], vec![fail(0)]).contains("both failed"));
        let mut not_utf8 = batch(vec![output(0, None)], vec![]);
        not_utf8.data[0] = 0xff;
        not_utf8.records[0].header_count = 1;
        assert!(decode(not_utf8, 1).unwrap_err().contains("not UTF-8"));
    }

    #[test]
    fn input_records_round_trip_through_spans() {
        let rec = |offset: i64, key: Option<&'static [u8]>, value: Option<&'static [u8]>| {
            ConsumerRecord {
                topic: "in".into(),
                partition: 3,
                offset: rill_client::Offset(offset),
                timestamp_ms: 7,
                key: key.map(Bytes::from_static),
                value: value.map(Bytes::from_static),
                headers: vec![Header {
                    key: "h".into(),
                    value: Bytes::from_static(b"v"),
                }],
            }
        };
        let mut buf = InputBuffer::default();
        buf.fill(&[rec(5, Some(b"k"), Some(b"val")), rec(6, None, None)]);
        let b = buf.batch("in", 3);
        let at = |s: Span| &b.data[s.start as usize..(s.start + s.len) as usize];
        assert_eq!(b.records.len(), 2);
        assert_eq!(at(b.records[0].key.unwrap()), b"k");
        assert_eq!(at(b.records[0].value.unwrap()), b"val");
        assert!(b.records[1].value.is_none(), "a tombstone stays one");
        assert_eq!(b.records[1].offset, 6);
        let h = &b.headers[b.records[1].first_header as usize];
        assert_eq!((at(h.key), at(h.value)), (&b"h"[..], &b"v"[..]));
    }
}
