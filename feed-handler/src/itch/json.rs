//! ITCH messages as JSON objects with the specification's field names, for `feed-handler decode`.
//!
//! Alpha fields become strings, integers numbers, prices decimal strings with their implied
//! decimals ("123.4500"), so the output can be diffed against other ITCH parsers.

use super::{for_each_variant, Message, Price4, Price8, Stock, Timestamp};
use serde_json::{Map, Value};
use zerocopy::byteorder::big_endian::{U16, U32, U64};

/// One message as a JSON object: `type`, `stock_locate`, `tracking_number`, `timestamp`
/// (nanoseconds since midnight), then the message's own fields in wire order.
pub fn to_json(message: &Message<'_>) -> Value {
    let header = message.header();
    let mut map = Map::new();
    map.insert("type".into(), header.message_type.json());
    map.insert("stock_locate".into(), header.stock_locate.json());
    map.insert("tracking_number".into(), header.tracking_number.json());
    map.insert("timestamp".into(), header.timestamp.json());
    for_each_variant!(*message, m => m.json_fields(&mut map));
    Value::Object(map)
}

/// A field's JSON form.
pub(crate) trait JsonField {
    fn json(&self) -> Value;
}

fn alpha(bytes: &[u8]) -> Value {
    // Alpha fields are ASCII by specification; anything else is shown byte for byte
    // (Latin-1) rather than dropped, so bad input stays visible.
    Value::String(bytes.iter().map(|&b| b as char).collect())
}

impl JsonField for u8 {
    fn json(&self) -> Value {
        alpha(&[*self])
    }
}
impl<const N: usize> JsonField for [u8; N] {
    fn json(&self) -> Value {
        alpha(self)
    }
}
impl JsonField for U16 {
    fn json(&self) -> Value {
        self.get().into()
    }
}
impl JsonField for U32 {
    fn json(&self) -> Value {
        self.get().into()
    }
}
impl JsonField for U64 {
    fn json(&self) -> Value {
        self.get().into()
    }
}
impl JsonField for Timestamp {
    fn json(&self) -> Value {
        self.nanos().into()
    }
}
impl JsonField for Stock {
    fn json(&self) -> Value {
        match self.as_str() {
            Some(s) => Value::String(s.to_owned()),
            None => alpha(&self.0),
        }
    }
}
impl JsonField for Price4 {
    fn json(&self) -> Value {
        Value::String(self.to_string())
    }
}
impl JsonField for Price8 {
    fn json(&self) -> Value {
        Value::String(self.to_string())
    }
}
