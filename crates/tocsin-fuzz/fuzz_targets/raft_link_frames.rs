//! The Raft link's frame reader on an arbitrary byte stream, as a peer (or
//! anyone reaching the port) could send it: frames are read until the
//! stream ends or a frame is refused. Nothing may panic or allocate past
//! the frame bound; every frame read re-encodes to one that reads back the
//! same.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tocsin_contract::link_frame::encode_frame;
use tocsin_contract::link_frame::read_frame;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().expect("a runtime"))
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let mut stream = data;
        while let Ok(Some(frame)) = read_frame(&mut stream).await {
            let mut buf = Vec::new();
            encode_frame(&frame, &mut buf);
            let again = read_frame(&mut buf.as_slice()).await.expect("an encoded frame reads").expect("one frame");
            assert_eq!(frame, again);
        }
    });
});
