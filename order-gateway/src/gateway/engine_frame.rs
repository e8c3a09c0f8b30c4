//! An engine frame read once: the header fields every path needs (the request number, the
//! engine's ClOrdID, the message type) and the request itself, if it decodes. The driver
//! decodes a frame once ([`EngineFrame::decode`]) and hands the value to the core
//! ([`super::Gateway::on_engine_frame`]); every reject a frame gets, whoever decides it
//! (the core: malformed; the driver: the journal cannot be written), is built by
//! [`EngineFrame::reject`], so the engine always finds its own ClOrdID and request type in it.

use crate::proto::{RejectReason, Request, Response};

/// An engine frame and what it says.
#[derive(Clone, Copy, Debug)]
pub struct EngineFrame<'a> {
    bytes: &'a [u8],
    /// The request sequence number in the header (0: unnumbered or no header).
    pub seq: u32,
    /// The engine's ClOrdID at its place in the frame (0: the frame is too short).
    pub cl_ord_id: u64,
    /// The message type byte (0: an empty frame).
    pub msg_type: u8,
    /// The request, or `None` if the frame does not decode.
    pub request: Option<Request>,
}

impl<'a> EngineFrame<'a> {
    /// Reads `bytes` once. Never fails: a frame that does not decode has no request, and
    /// what its header gives (zeros where it is too short).
    pub fn decode(bytes: &'a [u8]) -> EngineFrame<'a> {
        EngineFrame {
            bytes,
            seq: bytes
                .get(4..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes),
            cl_ord_id: bytes
                .get(8..16)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes),
            msg_type: bytes.first().copied().unwrap_or(0),
            request: Request::decode(bytes).ok().map(|(r, _)| r),
        }
    }

    /// The frame's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The reject this frame gets for `reason` (unnumbered: numbering is the core's).
    pub fn reject(&self, reason: RejectReason) -> Response {
        Response::reject(self.cl_ord_id, self.msg_type, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{msg_type, NewOrder, Side, Symbol, TimeInForce};

    #[test]
    fn a_request_is_read_once_with_its_header() {
        let mut r = Request::NewOrder(NewOrder::new(
            42,
            7,
            Symbol::new("AAPL").unwrap(),
            Side::Buy,
            10,
            100,
            TimeInForce::Day,
        ));
        r.set_seq(9);
        let f = EngineFrame::decode(r.as_bytes());
        assert_eq!(
            (f.seq, f.cl_ord_id, f.msg_type),
            (9, 42, msg_type::NEW_ORDER)
        );
        assert!(matches!(f.request, Some(Request::NewOrder(_))));
        let rej = f.reject(RejectReason::JournalUnavailable);
        assert_eq!(rej.cl_ord_id(), 42);
    }

    #[test]
    fn a_short_or_garbled_frame_has_no_request_and_zeros_for_what_it_lacks() {
        let f = EngineFrame::decode(&[]);
        assert_eq!((f.seq, f.cl_ord_id, f.msg_type), (0, 0, 0));
        assert!(f.request.is_none());
        let f = EngineFrame::decode(&[b'N', 0, 0, 0, 5, 0, 0, 0, 1]);
        assert_eq!((f.seq, f.cl_ord_id, f.msg_type), (5, 0, b'N'));
        assert!(f.request.is_none());
    }
}
