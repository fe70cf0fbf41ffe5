//! EC2's XML answers, written with quick-xml: `<{Action}Response xmlns=...>` with a
//! `requestId`, lists as `<name><item>..</item></name>`, and the error envelope
//! `<Response><Errors><Error><Code>..` (EC2 API reference, "Error responses").

use std::fmt::Display;

use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};

/// The namespace of EC2 API version 2016-11-15, the version every SDK sends.
pub const NAMESPACE: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// An XML document being written. Writing to memory cannot fail.
pub struct Xml(Writer<Vec<u8>>);

impl Xml {
    fn new() -> Self {
        let mut w = Writer::new(Vec::with_capacity(1024));
        w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))
            .expect("in memory");
        Self(w)
    }

    fn start(&mut self, tag: BytesStart<'_>) {
        self.0.write_event(Event::Start(tag)).expect("in memory");
    }

    fn end(&mut self, name: &str) {
        self.0
            .write_event(Event::End(BytesEnd::new(name)))
            .expect("in memory");
    }

    /// `<name>text</name>` (escaped).
    pub fn leaf(&mut self, name: &str, text: impl Display) -> &mut Self {
        self.start(BytesStart::new(name));
        self.0
            .write_event(Event::Text(BytesText::new(&text.to_string())))
            .expect("in memory");
        self.end(name);
        self
    }

    /// `<name>text</name>` when there is a text.
    pub fn opt(&mut self, name: &str, text: Option<impl Display>) -> &mut Self {
        if let Some(t) = text {
            self.leaf(name, t);
        }
        self
    }

    /// `<name>...</name>` with the content `f` writes.
    pub fn node(&mut self, name: &str, f: impl FnOnce(&mut Xml)) -> &mut Self {
        self.start(BytesStart::new(name));
        f(self);
        self.end(name);
        self
    }

    /// `<name><item>...</item>...</name>`, one item per element of `items`.
    pub fn list<T>(
        &mut self,
        name: &str,
        items: impl IntoIterator<Item = T>,
        mut f: impl FnMut(&mut Xml, T),
    ) -> &mut Self {
        self.node(name, |x| {
            for item in items {
                x.node("item", |x| f(x, item));
            }
        })
    }

    /// A `tagSet`.
    pub fn tags<'a>(
        &mut self,
        tags: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> &mut Self {
        self.list("tagSet", tags, |x, (k, v)| {
            x.leaf("key", k).leaf("value", v);
        })
    }

    /// A successful answer of `action`: its content is what `body` writes after the requestId.
    pub fn answer(action: &str, request_id: &str, body: impl FnOnce(&mut Xml)) -> Vec<u8> {
        let mut x = Self::new();
        let root = format!("{action}Response");
        x.start(BytesStart::new(root.as_str()).with_attributes([("xmlns", NAMESPACE)]));
        x.leaf("requestId", request_id);
        body(&mut x);
        x.end(&root);
        x.0.into_inner()
    }

    /// EC2's error envelope (note `RequestID`, upper case, as AWS writes it there).
    pub fn error(code: &str, message: &str, request_id: &str) -> Vec<u8> {
        let mut x = Self::new();
        x.node("Response", |x| {
            x.node("Errors", |x| {
                x.node("Error", |x| {
                    x.leaf("Code", code).leaf("Message", message);
                });
            });
            x.leaf("RequestID", request_id);
        });
        x.0.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_errors_have_aws_shape_and_escape_text() {
        let body = Xml::answer(
            "DescribeThingsResponse".trim_end_matches("Response"),
            "r-1",
            |x| {
                x.list("thingSet", ["a<b"], |x, t| {
                    x.leaf("name", t);
                });
            },
        );
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "<DescribeThingsResponse xmlns=\"{NAMESPACE}\"><requestId>r-1</requestId><thingSet><item><name>a&lt;b</name></item></thingSet></DescribeThingsResponse>"
            )),
            "{text}"
        );
        let err = String::from_utf8(Xml::error("Bad", "x & y", "r-2")).unwrap();
        assert!(
            err.ends_with("<Response><Errors><Error><Code>Bad</Code><Message>x &amp; y</Message></Error></Errors><RequestID>r-2</RequestID></Response>"),
            "{err}"
        );
    }
}
