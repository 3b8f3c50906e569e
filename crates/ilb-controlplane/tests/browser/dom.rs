//! A small, forgiving parser for the HTML that `chromium --dump-dom` prints, so the dashboard
//! test can query the rendered page (by id, tag and attributes) without an HTML crate.
//!
//! Chromium serialises a normalised DOM: lowercase tag names, attributes in double quotes with
//! `&amp;` and `&quot;` escaped, every non-void element closed. That is all this relies on; it
//! is not a general HTML5 parser.

use std::collections::BTreeMap;

/// Elements that never have children or an end tag.
const VOID: [&str; 14] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
    "wbr",
];

#[derive(Debug, Default)]
pub struct Element {
    pub tag: String,
    pub attrs: BTreeMap<String, String>,
    pub children: Vec<Node>,
}

#[derive(Debug)]
pub enum Node {
    Element(Element),
    Text(String),
}

impl Element {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).map(String::as_str)
    }

    /// Every element below this one, depth first, in document order.
    pub fn descendants(&self) -> Vec<&Element> {
        let mut out = Vec::new();
        fn walk<'a>(e: &'a Element, out: &mut Vec<&'a Element>) {
            for child in &e.children {
                if let Node::Element(c) = child {
                    out.push(c);
                    walk(c, out);
                }
            }
        }
        walk(self, &mut out);
        out
    }

    /// Descendants matching a simple selector: `tag`, `[attr]`, `[attr=value]`, `#id`, or a
    /// tag followed by attribute tests (`td[data-engine=engine-c]`).
    pub fn select(&self, selector: &str) -> Vec<&Element> {
        let test = Selector::parse(selector);
        self.descendants().into_iter().filter(|e| test.matches(e)).collect()
    }

    /// The first descendant matching `selector`.
    pub fn first(&self, selector: &str) -> Option<&Element> {
        self.select(selector).into_iter().next()
    }

    pub fn by_id(&self, id: &str) -> Option<&Element> {
        self.first(&format!("#{id}"))
    }

    /// Concatenated text content, whitespace collapsed.
    pub fn text(&self) -> String {
        let mut raw = String::new();
        fn walk(e: &Element, out: &mut String) {
            for child in &e.children {
                match child {
                    Node::Text(t) => out.push_str(t),
                    Node::Element(c) => walk(c, out),
                }
            }
        }
        walk(self, &mut raw);
        raw.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

struct Selector {
    tag: Option<String>,
    attrs: Vec<(String, Option<String>)>,
}

impl Selector {
    fn parse(s: &str) -> Selector {
        if let Some(id) = s.strip_prefix('#') {
            return Selector { tag: None, attrs: vec![("id".into(), Some(id.into()))] };
        }
        let (tag, rest) = s.split_once('[').map_or((s, ""), |(t, r)| (t, r));
        let attrs = rest
            .split('[')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let p = p.trim_end_matches(']');
                match p.split_once('=') {
                    Some((k, v)) => (k.to_owned(), Some(v.trim_matches('"').to_owned())),
                    None => (p.to_owned(), None),
                }
            })
            .collect();
        Selector { tag: (!tag.is_empty()).then(|| tag.to_owned()), attrs }
    }

    fn matches(&self, e: &Element) -> bool {
        self.tag.as_ref().is_none_or(|t| *t == e.tag)
            && self.attrs.iter().all(|(k, v)| match (e.attr(k), v) {
                (Some(_), None) => true,
                (Some(have), Some(want)) => have == want,
                (None, _) => false,
            })
    }
}

fn decode(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// Parses a serialised document into a synthetic root element holding its top-level nodes.
pub fn parse(html: &str) -> Element {
    let mut stack: Vec<Element> = vec![Element { tag: "#root".into(), ..Element::default() }];
    let mut rest = html;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            push_text(&mut stack, rest);
            break;
        };
        push_text(&mut stack, &rest[..lt]);
        rest = &rest[lt..];
        if let Some(after) = rest.strip_prefix("<!--") {
            rest = after.find("-->").map_or("", |end| &after[end + 3..]);
        } else if rest.starts_with("<!") || rest.starts_with("<?") {
            rest = rest.find('>').map_or("", |end| &rest[end + 1..]);
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').unwrap_or(after.len());
            let name = after[..end].trim().to_ascii_lowercase();
            rest = after.get(end + 1..).unwrap_or("");
            // Pop up to the matching open element; ignore a stray end tag.
            if let Some(depth) = stack.iter().rposition(|e| e.tag == name) {
                while stack.len() > depth.max(1) {
                    close(&mut stack);
                }
            }
        } else {
            let (element, self_closed, after) = start_tag(&rest[1..]);
            rest = after;
            let raw_text = matches!(element.tag.as_str(), "script" | "style" | "textarea" | "title");
            if VOID.contains(&element.tag.as_str()) || self_closed {
                push(&mut stack, Node::Element(element));
            } else if raw_text {
                let end_tag = format!("</{}", element.tag);
                let end = rest.find(&end_tag).unwrap_or(rest.len());
                let mut element = element;
                element.children.push(Node::Text(decode(&rest[..end])));
                rest = rest[end..].find('>').map_or("", |gt| &rest[end + gt + 1..]);
                push(&mut stack, Node::Element(element));
            } else {
                stack.push(element);
            }
        }
    }
    while stack.len() > 1 {
        close(&mut stack);
    }
    stack.pop().unwrap_or_default()
}

fn push(stack: &mut [Element], node: Node) {
    if let Some(top) = stack.last_mut() {
        top.children.push(node);
    }
}

fn push_text(stack: &mut [Element], text: &str) {
    if !text.is_empty() {
        push(stack, Node::Text(decode(text)));
    }
}

fn close(stack: &mut Vec<Element>) {
    if let Some(done) = stack.pop() {
        push(stack, Node::Element(done));
    }
}

/// Parses `tag attr="v" ...>` (the `<` already consumed); returns the element, whether it
/// ended in `/>`, and the input after the `>`.
fn start_tag(s: &str) -> (Element, bool, &str) {
    let name_end = s.find(|c: char| c.is_whitespace() || c == '>' || c == '/').unwrap_or(s.len());
    let mut element = Element { tag: s[..name_end].to_ascii_lowercase(), ..Element::default() };
    let mut rest = &s[name_end..];
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("/>") {
            return (element, true, after);
        }
        if let Some(after) = rest.strip_prefix('>') {
            return (element, false, after);
        }
        if rest.is_empty() {
            return (element, false, rest);
        }
        if let Some(after) = rest.strip_prefix('/') {
            rest = after;
            continue;
        }
        let key_end =
            rest.find(|c: char| c.is_whitespace() || c == '=' || c == '>' || c == '/').unwrap_or(rest.len());
        let key = rest[..key_end].to_ascii_lowercase();
        rest = &rest[key_end..];
        let value = if let Some(after) = rest.trim_start().strip_prefix('=') {
            let after = after.trim_start();
            if let Some(quoted) = after.strip_prefix('"') {
                let end = quoted.find('"').unwrap_or(quoted.len());
                rest = quoted.get(end + 1..).unwrap_or("");
                decode(&quoted[..end])
            } else {
                let end = after.find(|c: char| c.is_whitespace() || c == '>').unwrap_or(after.len());
                rest = &after[end..];
                decode(&after[..end])
            }
        } else {
            String::new()
        };
        element.attrs.insert(key, value);
    }
}

#[test]
fn parses_nested_attributes_and_raw_text() {
    let root = parse(
        r#"<!DOCTYPE html><html><head><script>if (a < b) { x = "</div>"; }</script></head><body data-state="live">
        <table id="heatmap"><tr data-cluster="b"><td data-engine="engine-c" data-weight="0.25">25&nbsp;%<br></td></tr></table>
        <svg><path data-engine="e" d="M0 0"></path></svg></body></html>"#,
    );
    let heatmap = root.by_id("heatmap").unwrap();
    let cell = heatmap.first("td[data-engine=engine-c]").unwrap();
    assert_eq!(cell.attr("data-weight"), Some("0.25"));
    assert_eq!(cell.text(), "25 %", "a no-break space counts as whitespace");
    assert_eq!(root.first("body").unwrap().attr("data-state"), Some("live"));
    assert_eq!(root.select("path[data-engine]").len(), 1);
    assert!(root.first("script").unwrap().text().contains("</div>"));
}
