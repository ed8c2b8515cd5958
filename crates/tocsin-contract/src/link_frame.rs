//! The Raft link's framing (`proto/tocsin/v1/raft.proto`): the preface a
//! connecting side writes, then frames of a 4-byte big-endian length and a
//! `RaftLinkFrame`. The node's link (`tocsin-node`'s `shard/link.rs`) reads
//! and writes through these; they live here, apart from RocksDB and
//! openraft, so the frame reader can be fuzzed on its own.

use std::io;

use prost::Message as _;
use tocsin_proto::v1 as pb;
use tokio::io::AsyncReadExt;

/// What a connecting link writes first. Its first byte is not the first
/// byte of HTTP/2's preface (`P`), nor of a TLS handshake.
pub const PREFACE: &[u8; 8] = b"TCSNRL01";
/// Largest frame either side accepts (an append with many payloads).
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// Appends `frame`, length first, to `buf`.
pub fn encode_frame(frame: &pb::RaftLinkFrame, buf: &mut Vec<u8>) {
    let at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    frame.encode(buf).expect("a Vec grows as needed");
    let len = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Reads one frame; `None` at a clean end of stream. A frame over
/// [`MAX_FRAME_BYTES`] is refused before its body is read.
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(read: &mut R) -> io::Result<Option<pb::RaftLinkFrame>> {
    let mut len = [0u8; 4];
    match read.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("raft link frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    read.read_exact(&mut body).await?;
    pb::RaftLinkFrame::decode(body.as_slice()).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_oversize_ones_are_refused() {
        let frame = pb::RaftLinkFrame {
            requests: vec![pb::RaftLinkRequest {
                id: 7,
                group_id: 3,
                payload: vec![1, 2, 3].into(),
                ..Default::default()
            }],
            replies: Vec::new(),
        };
        let mut buf = Vec::new();
        encode_frame(&frame, &mut buf);
        encode_frame(&frame, &mut buf);
        let mut read = buf.as_slice();
        assert_eq!(read_frame(&mut read).await.unwrap(), Some(frame.clone()));
        assert_eq!(read_frame(&mut read).await.unwrap(), Some(frame));
        assert_eq!(read_frame(&mut read).await.unwrap(), None);
        let oversize = ((MAX_FRAME_BYTES as u32) + 1).to_be_bytes();
        assert_eq!(read_frame(&mut oversize.as_slice()).await.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
