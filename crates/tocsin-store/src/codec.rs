//! Value encoding: one format-version byte, then postcard (a compact,
//! positional serde format).
//!
//! The version byte lets a later release read older rows. A value that does
//! not decode is corruption, reported as `InvalidData`, never skipped.

use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The only format written so far.
const FORMAT_V1: u8 = 1;

pub fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let mut out = vec![FORMAT_V1];
    postcard::to_io(value, &mut out)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encode: {e}")))?;
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    match bytes.split_first() {
        Some((&FORMAT_V1, rest)) => {
            postcard::from_bytes(rest).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decode: {e}")))
        }
        Some((v, _)) => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown value format {v}"))),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "empty value")),
    }
}
