//! The parameters of an EC2 Query API request (`Action=...&Filter.1.Name=...`), parsed with
//! `form_urlencoded`. Lists are `Name.1`, `Name.2`, ... (1-based), as the SDKs send them.

use std::collections::BTreeMap;

use eni_operator::ec2::model::Tags;

use super::WireError;

/// The decoded parameters of one request.
#[derive(Debug, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    /// Form body and query string together (SDKs POST a form; GET with a query also works).
    pub fn parse(query: Option<&str>, body: &[u8]) -> Self {
        let mut map = BTreeMap::new();
        let query = query.unwrap_or_default().as_bytes();
        for (k, v) in form_urlencoded::parse(query).chain(form_urlencoded::parse(body)) {
            map.insert(k.into_owned(), v.into_owned());
        }
        Self(map)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// A required parameter, or AWS's `MissingParameter`.
    pub fn require(&self, key: &str) -> Result<&str, WireError> {
        self.get(key).filter(|v| !v.is_empty()).ok_or_else(|| {
            WireError::client(
                "MissingParameter",
                format!("The request must contain the parameter {key}"),
            )
        })
    }

    /// An integer parameter, or AWS's `InvalidParameterValue`.
    pub fn int(&self, key: &str) -> Result<Option<i64>, WireError> {
        self.get(key)
            .map(|v| {
                v.parse().map_err(|_| {
                    WireError::client(
                        "InvalidParameterValue",
                        format!("Invalid value '{v}' for {key}"),
                    )
                })
            })
            .transpose()
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key).map(|v| v.eq_ignore_ascii_case("true"))
    }

    /// The values of the list `prefix.1`, `prefix.2`, ... in index order.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let mut items: Vec<(u32, String)> = self
            .0
            .range(format!("{prefix}.")..)
            .take_while(|(k, _)| k.starts_with(&format!("{prefix}.")))
            .filter_map(|(k, v)| Some((k[prefix.len() + 1..].parse().ok()?, v.clone())))
            .collect();
        items.sort_by_key(|(i, _)| *i);
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// The indexes `n` of `prefix.n.<anything>`, in order.
    pub fn indexes(&self, prefix: &str) -> Vec<u32> {
        let start = format!("{prefix}.");
        let mut idx: Vec<u32> = self
            .0
            .range(start.clone()..)
            .take_while(|(k, _)| k.starts_with(&start))
            .filter_map(|(k, _)| k[start.len()..].split('.').next()?.parse().ok())
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    /// `Filter.N.Name` with its `Filter.N.Value.M` values, in order.
    pub fn filters(&self) -> Vec<(String, Vec<String>)> {
        self.indexes("Filter")
            .into_iter()
            .filter_map(|n| {
                let name = self.get(&format!("Filter.{n}.Name"))?.to_owned();
                Some((name, self.list(&format!("Filter.{n}.Value"))))
            })
            .collect()
    }

    /// The tags of `TagSpecification.N` whose `ResourceType` is `resource_type`.
    pub fn tag_specification(&self, resource_type: &str) -> Tags {
        let mut tags = Tags::new();
        for n in self.indexes("TagSpecification") {
            if self.get(&format!("TagSpecification.{n}.ResourceType")) != Some(resource_type) {
                continue;
            }
            for m in self.indexes(&format!("TagSpecification.{n}.Tag")) {
                if let Some(k) = self.get(&format!("TagSpecification.{n}.Tag.{m}.Key")) {
                    let v = self
                        .get(&format!("TagSpecification.{n}.Tag.{m}.Value"))
                        .unwrap_or_default();
                    tags.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        tags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_filters_and_tags_come_back_in_index_order() {
        let body = b"Action=X&InstanceId.10=i-10&InstanceId.2=i-2&InstanceId.1=i-1\
            &Filter.1.Name=vpc-id&Filter.1.Value.1=vpc-1&Filter.2.Name=tag%3Ak&Filter.2.Value.1=v\
            &Filter.2.Value.2=w&TagSpecification.1.ResourceType=network-interface\
            &TagSpecification.1.Tag.1.Key=a&TagSpecification.1.Tag.1.Value=b\
            &TagSpecification.2.ResourceType=instance&TagSpecification.2.Tag.1.Key=c";
        let p = Params::parse(Some("Version=2016-11-15"), body);
        assert_eq!(p.get("Version"), Some("2016-11-15"));
        assert_eq!(p.list("InstanceId"), ["i-1", "i-2", "i-10"]);
        assert_eq!(
            p.filters(),
            vec![
                ("vpc-id".to_owned(), vec!["vpc-1".to_owned()]),
                ("tag:k".to_owned(), vec!["v".to_owned(), "w".to_owned()]),
            ]
        );
        assert_eq!(
            p.tag_specification("network-interface"),
            Tags::from([("a".to_owned(), "b".to_owned())])
        );
        assert_eq!(
            p.tag_specification("instance"),
            Tags::from([("c".to_owned(), String::new())])
        );
        assert!(p.require("SubnetId").is_err());
        assert!(p.int("Action").is_err());
    }
}
