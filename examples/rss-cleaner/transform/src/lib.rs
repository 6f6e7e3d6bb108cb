//! The RSS article cleaner: reads the articles `rss-load` publishes (key = the
//! item's guid or link; value = JSON with title, link, published, content as raw
//! HTML) and writes clean ones (JSON with title, link, published, text).
//!
//! Per article: strip the HTML tags (dropping `<script>` and `<style>` bodies),
//! decode the entities, normalise the whitespace; drop an article whose title
//! and text are both empty; drop one whose key was seen before (de-duplication
//! with transform state, so it survives restarts and partition moves). An
//! article that is not JSON or has no link is an error, which the deployment's
//! `--on-error dead-letter` sends to the dead-letter topic.
//!
//! Config: `dedup=false` turns de-duplication off; `max_text_chars=N` cuts the
//! text to N characters (default 2000).

use rill_sdk::{Config, Output, Record};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct Article {
    title: Option<String>,
    link: Option<String>,
    published: Option<String>,
    content: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct CleanArticle {
    pub title: String,
    pub link: String,
    pub published: Option<String>,
    pub text: String,
}

fn setup(config: &Config) -> Result<(), String> {
    config.parse_or("dedup", true)?;
    config.parse_or("max_text_chars", 2000usize)?;
    Ok(())
}

#[rill_sdk::transform(init = setup)]
fn clean(record: Record) -> Result<Option<Output>, String> {
    let value = record.value.as_deref().ok_or("a tombstone is not an article")?;
    let article: Article = serde_json::from_slice(value)
        .map_err(|e| format!("the article is not JSON with title/link/published/content: {e}"))?;
    let link = article
        .link
        .filter(|l| l.starts_with("http://") || l.starts_with("https://"))
        .ok_or("the article has no http(s) link")?;
    let max_chars: usize = rill_sdk::config::get("max_text_chars")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let title = to_text(article.title.as_deref().unwrap_or(""));
    let mut text = to_text(article.content.as_deref().unwrap_or(""));
    // A text of at most max_chars bytes has at most max_chars characters.
    if text.len() > max_chars
        && let Some((cut, _)) = text.char_indices().nth(max_chars)
    {
        text.truncate(cut);
        text.push('…');
    }
    if title.is_empty() && text.is_empty() {
        rill_sdk::log::debug(format!("dropping empty article {link}"));
        return Ok(None);
    }
    let key = record.key.clone().unwrap_or_else(|| link.clone().into_bytes());
    let dedup = rill_sdk::config::get("dedup").is_none_or(|v| v != "false");
    if dedup {
        let seen_key = [b"seen/".as_slice(), &key].concat();
        if rill_sdk::state::contains(&seen_key) {
            rill_sdk::log::info(format!("dropping duplicate article {link}"));
            return Ok(None);
        }
        rill_sdk::state::put(&seen_key, b"1");
    }
    let clean = CleanArticle {
        title,
        link,
        published: article.published,
        text,
    };
    let json = serde_json::to_vec(&clean).map_err(|e| e.to_string())?;
    Ok(Some(Output::new(json).key(key)))
}

/// HTML to plain text: tags stripped, entities decoded, whitespace normalised.
pub fn to_text(html: &str) -> String {
    let stripped = strip_tags(html);
    let decoded = html_escape::decode_html_entities(&stripped);
    normalise_whitespace(&decoded)
}

/// Removes tags and comments; the bodies of script and style elements go too.
/// Block-level tags become a space so words on either side stay apart.
/// One pass, no allocation per tag (tag names compare case-insensitively).
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(lt) = rest.find('<') {
        out.push_str(&rest[..lt]);
        let tail = &rest[lt..];
        if let Some(body) = tail.strip_prefix("<!--") {
            rest = body.find("-->").map_or("", |end| &body[end + 3..]);
            continue;
        }
        let Some(gt) = tail.find('>') else {
            // A lone '<' is text ("a < b").
            out.push_str(tail);
            rest = "";
            break;
        };
        let closing = tail[1..].starts_with('/');
        let name = tag_name(tail[1..gt].trim_start_matches('/'));
        rest = &tail[gt + 1..];
        if name.is_empty() && !closing {
            out.push_str(&tail[..=gt]);
            continue;
        }
        if !closing && (name.eq_ignore_ascii_case("script") || name.eq_ignore_ascii_case("style")) {
            rest = after_closing_tag(rest, name);
        }
        out.push(' ');
    }
    out.push_str(rest);
    out
}

/// The leading ASCII letters and digits of a tag's content.
fn tag_name(tag: &str) -> &str {
    let end = tag
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(tag.len());
    &tag[..end]
}

/// What follows `</name ...>` in `s` (any case), or nothing if it is not closed.
fn after_closing_tag<'a>(s: &'a str, name: &str) -> &'a str {
    let mut from = 0;
    while let Some(at) = s[from..].find("</") {
        let at = from + at;
        let candidate = &s[at + 2..];
        if tag_name(candidate).eq_ignore_ascii_case(name) {
            return candidate.find('>').map_or("", |g| &candidate[g + 1..]);
        }
        from = at + 2;
    }
    ""
}

/// Runs of whitespace become one space; none at either end.
fn normalise_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_sdk::testing;

    fn article(title: &str, link: &str, content: &str) -> Record {
        let v = serde_json::json!({"title": title, "link": link, "published": "2026-12-01T10:00:00Z", "content": content});
        Record::new(serde_json::to_vec(&v).unwrap()).with_key(link)
    }

    fn parse(out: Output) -> CleanArticle {
        serde_json::from_slice(&out.value.unwrap()).unwrap()
    }

    #[test]
    fn strips_html_decodes_entities_and_normalises_whitespace() {
        testing::reset();
        let out = clean(article(
            "Caf&eacute; &amp; <b>Code</b>",
            "https://example.org/a",
            "<p>Hello,\n\n   <em>world</em>&nbsp;&#8212; it&#8217;s <a href=\"x\">here</a>.</p><script>alert(1)</script><style>p{}</style><!-- note -->",
        ))
        .unwrap()
        .unwrap();
        let a = parse(out);
        assert_eq!(a.title, "Café & Code");
        assert_eq!(a.text, "Hello, world — it’s here .");
    }

    #[test]
    fn drops_script_and_style_bodies_in_any_case() {
        assert_eq!(
            to_text("a<SCRIPT type=x>if (a</b) x()</b></Script >b<style>p{}</STYLE>c"),
            "a b c"
        );
        assert_eq!(to_text("a<script>never closed"), "a");
        assert_eq!(to_text("<scripts>kept</scripts>"), "kept");
    }

    #[test]
    fn keeps_a_lone_less_than_sign() {
        assert_eq!(to_text("1 < 2 and 3 > 2"), "1 < 2 and 3 > 2");
    }

    #[test]
    fn drops_empty_articles_and_duplicates() {
        testing::reset();
        assert!(clean(article("", "https://example.org/e", "<p> </p>")).unwrap().is_none());
        assert!(clean(article("T", "https://example.org/d", "x")).unwrap().is_some());
        assert!(clean(article("T", "https://example.org/d", "x")).unwrap().is_none());
        assert_eq!(testing::state().len(), 1);
        assert!(testing::logs().iter().any(|(_, l)| l.contains("duplicate")));
    }

    #[test]
    fn dedup_can_be_turned_off() {
        testing::reset();
        testing::init(&[("dedup", "false")], setup).unwrap();
        assert!(clean(article("T", "https://example.org/d", "x")).unwrap().is_some());
        assert!(clean(article("T", "https://example.org/d", "x")).unwrap().is_some());
        assert!(testing::init(&[("max_text_chars", "many")], setup).is_err());
    }

    #[test]
    fn unparseable_articles_are_errors() {
        testing::reset();
        assert!(clean(Record::new("not json")).unwrap_err().contains("not JSON"));
        let no_link = Record::new(r#"{"title":"t","content":"c"}"#);
        assert!(clean(no_link).unwrap_err().contains("no http(s) link"));
    }
}
