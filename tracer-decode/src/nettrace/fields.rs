//! The fields a payload is made of, as event metadata declares them: the types both payload
//! decoders and the metadata reader share (no module of the decoder depends on another for them).

/// Type of one payload field (type codes of docs/protocol/nettrace.md §6).
#[derive(Debug, Clone, PartialEq)]
pub enum FieldType {
    Object(Vec<FieldDef>),
    Boolean,
    Char16,
    SByte,
    Byte,
    Int16,
    UInt16,
    Int32,
    UInt32,
    Int64,
    UInt64,
    Single,
    Double,
    DateTime,
    Guid,
    String,
    Array(Box<FieldType>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldDef {
    pub name: String,
    pub ty: FieldType,
    /// The name is ASCII letters, digits and `_`: written into JSON as it is (nearly every name
    /// is; known once here rather than looked over for escapes in every event).
    pub plain_name: bool,
}

impl FieldDef {
    pub fn new(name: String, ty: FieldType) -> FieldDef {
        let plain_name = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        FieldDef { name, ty, plain_name }
    }
}
