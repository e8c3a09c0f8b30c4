//! Recovery messages (several may share one RC buffer) on arbitrary bytes: decoding never
//! panics, never claims more bytes than it was given, and every decoded message re-encodes to
//! one that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocebus::mcast::wire::{
    decode_recovery, encode_auth_proof, encode_retransmit_data, encode_snapshot_chunk, encode_snapshot_request,
    Datagram, RecoveryMsg, RECOVERY_HEADER_LEN,
};

fn reencode(msg: &RecoveryMsg<'_>, out: &mut [u8]) -> usize {
    let n = match *msg {
        RecoveryMsg::RetransmitRequest(r) => r.encode(out),
        RecoveryMsg::NotAvailable(r) => r.encode(out),
        RecoveryMsg::SnapshotEnd(r) => r.encode(out),
        RecoveryMsg::RetransmitData {
            channel,
            session,
            datagram,
        } => encode_retransmit_data(out, channel, session, datagram),
        RecoveryMsg::SnapshotRequest { channel, session } => {
            encode_snapshot_request(out, channel, session)
        }
        RecoveryMsg::SnapshotChunk {
            channel,
            session,
            snapshot_seq,
            offset,
            data,
        } => encode_snapshot_chunk(out, channel, session, snapshot_seq, offset, data),
        RecoveryMsg::AuthProof { channel, tag } => encode_auth_proof(out, channel, &tag),
        RecoveryMsg::SubscriberStatus(s) => s.encode(out),
    };
    n.expect("a decoded message fits the buffer it was decoded from")
}

fuzz_target!(|data: &[u8]| {
    let mut out = vec![0u8; data.len()];
    let mut rest = data;
    while let Ok((msg, n)) = decode_recovery(rest) {
        assert!((RECOVERY_HEADER_LEN..=rest.len()).contains(&n));
        let m = reencode(&msg, &mut out);
        assert_eq!(m, n);
        assert_eq!(decode_recovery(&out[..m]), Ok((msg, m)));
        if let RecoveryMsg::RetransmitData { datagram, .. } = msg {
            let _ = Datagram::parse(datagram);
        }
        rest = &rest[n..];
    }
});
