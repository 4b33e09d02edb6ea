//! The firmware protocol's decoder on arbitrary packets: it must never panic, and whatever it
//! accepts must re-encode to bytes that decode to the same message and encode identically
//! (so a daemon that echoes or forwards a message cannot be made to emit something else).
#![no_main]

use fulcrum_board::protocol::{decode, Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The header alone is what a receiver reads first to name the request in its reply.
    let header = Header::decode(data);
    let Ok((h, message)) = decode(data) else {
        return;
    };
    assert_eq!(header, Ok(h));
    assert_eq!(h.body_len as usize + HEADER_LEN, data.len());
    let mut buf = vec![0u8; message.encoded_len()];
    let n = message
        .encode(h.sequence, h.timestamp_us, &mut buf)
        .expect("a decoded message encodes");
    assert_eq!(n, data.len(), "re-encoded length differs");
    let (h2, again) = decode(&buf).expect("a re-encoded message decodes");
    assert_eq!(h2, h);
    assert_eq!(again.kind(), message.kind());
    let mut buf2 = vec![0u8; again.encoded_len()];
    again.encode(h.sequence, h.timestamp_us, &mut buf2).unwrap();
    assert_eq!(buf2, buf, "encoding is not a fixed point");
});
