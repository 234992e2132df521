//! Named values kept in the order they came, serialized as a JSON object in that order: a
//! payload's fields (metadata order), an ftrace record's (format order), a detection line's body.
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderedMap<K, V>(pub Vec<(K, V)>);

impl<K, V> Default for OrderedMap<K, V> {
    fn default() -> Self {
        OrderedMap(Vec::new())
    }
}

impl<K: AsRef<str>, V> OrderedMap<K, V> {
    /// The first value named `name`.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.0.iter().find(|(n, _)| n.as_ref() == name).map(|(_, v)| v)
    }
}

impl<K, V> OrderedMap<K, V> {
    pub fn push(&mut self, key: K, value: impl Into<V>) -> &mut Self {
        self.0.push((key, value.into()));
        self
    }
}

impl<K: Serialize, V: Serialize> Serialize for OrderedMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_order_it_was_given() {
        let mut map = OrderedMap::<&str, u32>::default();
        map.push("z", 1u32).push("a", 2u32).push("z", 3u32);
        assert_eq!(serde_json::to_string(&map).unwrap(), r#"{"z":1,"a":2,"z":3}"#);
        assert_eq!(map.get("z"), Some(&1));
        assert_eq!(map.get("b"), None);
    }
}
