//! The app's files, embedded in the binary (hand-written; no build step).

pub(crate) const INDEX_HTML: &str = include_str!("assets/index.html");
pub(crate) const APP_JS: &str = include_str!("assets/app.js");
pub(crate) const APP_CSS: &str = include_str!("assets/app.css");
