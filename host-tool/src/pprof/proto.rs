//! The messages of pprof's profile.proto
//! (github.com/google/pprof/blob/main/proto/profile.proto), written out by
//! hand with prost's derive: the field numbers and types are the proto's.

/// A whole profile; strings are indices into `string_table`, whose first
/// entry is "".
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each sample value is.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// The mapped files.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Code addresses.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regexp of frames to drop (string index).
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regexp of frames to keep (string index).
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// When the profile was taken (ns since the Unix epoch).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long it covers (ns).
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What one sampling period counts.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// The sampling period, in `period_type` units.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type shown by default (string index of its type).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// A value's type and unit (string indices).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// E.g. "cpu".
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// E.g. "nanoseconds".
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack with its values and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Locations, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `sample_type`.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample label: a string or a number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Key (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String value (string index), or 0.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// Unit of `num` (string index).
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A mapped file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// First address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End address (exclusive).
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// The file (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Its build-id, as hex (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Locations here carry function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// ... source files.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// ... line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// ... inlined frames.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A code address and its (inlined) source lines.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its mapping (0: none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Lines, innermost (inlined) first; the last is the caller.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Several symbols folded into one.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A function and line.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// The function.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Source line.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Source column.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Demangled name (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Name as in the symbol table (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Source file (string index).
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
