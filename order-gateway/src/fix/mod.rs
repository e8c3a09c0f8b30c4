//! FIX 4.4: a codec ([`codec`]) and an I/O-free initiator session ([`session`]).
//!
//! # Why our own encoder and not a FIX crate
//!
//! We looked at the maintained Rust FIX crates (`fefix` 0.7, last released 2022 and
//! unmaintained since; `hotfix` 0.13, a buy-side engine built on tokio). Neither fits:
//! `hotfix` owns its sockets, timers and store (a tokio task per session), which breaks the
//! rule that protocol logic is a state machine taking `now` and bytes, and it allocates per
//! message; `fefix` has a dictionary-driven decoder we could use, but it is stale and pulls in
//! tokio/openssl/chrono by default. The subset a gateway needs is small: a dozen header and
//! order tags, BodyLength and CheckSum, and the session rules. Our encoder writes fields into
//! a reused buffer with no allocation and no dictionary lookup; the decoder is a zero-copy
//! `tag=value` iterator over the received frame. The real acceptor in the tests (QuickFIX,
//! validating against its own FIX44.xml) is the check that our messages are well formed, and
//! the decoder is fuzzed (`order-gateway/fuzz`). Revisit if we need FIX dictionaries beyond
//! orders and executions (e.g. repeating groups for allocations).

pub mod codec;
pub mod session;

pub use codec::{split_frame, FixError, Message, MessageWriter};
pub use session::{Secret, Session, SessionConfig, SessionCounters, SessionEvent, SessionState};

/// FIX tag numbers used by the gateway.
#[allow(missing_docs)]
pub mod tag {
    pub const BEGIN_STRING: u32 = 8;
    pub const BODY_LENGTH: u32 = 9;
    pub const CHECKSUM: u32 = 10;
    pub const MSG_TYPE: u32 = 35;
    pub const SENDER_COMP_ID: u32 = 49;
    pub const TARGET_COMP_ID: u32 = 56;
    pub const MSG_SEQ_NUM: u32 = 34;
    pub const SENDING_TIME: u32 = 52;
    pub const POSS_DUP_FLAG: u32 = 43;
    pub const ORIG_SENDING_TIME: u32 = 122;
    pub const BEGIN_SEQ_NO: u32 = 7;
    pub const END_SEQ_NO: u32 = 16;
    pub const NEW_SEQ_NO: u32 = 36;
    pub const GAP_FILL_FLAG: u32 = 123;
    pub const TEST_REQ_ID: u32 = 112;
    pub const HEART_BT_INT: u32 = 108;
    pub const ENCRYPT_METHOD: u32 = 98;
    pub const REF_SEQ_NUM: u32 = 45;
    pub const REF_TAG_ID: u32 = 371;
    pub const SESSION_REJECT_REASON: u32 = 373;
    pub const TEXT: u32 = 58;
    pub const CL_ORD_ID: u32 = 11;
    pub const ORIG_CL_ORD_ID: u32 = 41;
    pub const ORDER_ID: u32 = 37;
    pub const EXEC_ID: u32 = 17;
    pub const EXEC_TYPE: u32 = 150;
    pub const ORD_STATUS: u32 = 39;
    pub const SYMBOL: u32 = 55;
    pub const SIDE: u32 = 54;
    pub const ORDER_QTY: u32 = 38;
    pub const ORD_TYPE: u32 = 40;
    pub const PRICE: u32 = 44;
    pub const TIME_IN_FORCE: u32 = 59;
    pub const TRANSACT_TIME: u32 = 60;
    pub const LAST_QTY: u32 = 32;
    pub const LAST_PX: u32 = 31;
    pub const LEAVES_QTY: u32 = 151;
    pub const CUM_QTY: u32 = 14;
    pub const AVG_PX: u32 = 6;
    pub const ACCOUNT: u32 = 1;
    pub const CXL_REJ_RESPONSE_TO: u32 = 434;
    pub const RESET_SEQ_NUM_FLAG: u32 = 141;
    pub const REF_MSG_TYPE: u32 = 372;
    pub const EXEC_REF_ID: u32 = 19;
    pub const POSS_RESEND: u32 = 97;
    pub const NEXT_EXPECTED_MSG_SEQ_NUM: u32 = 789;
    pub const BUSINESS_REJECT_REF_ID: u32 = 379;
    pub const USERNAME: u32 = 553;
    pub const PASSWORD: u32 = 554;
}
