//! NASDAQ TotalView-ITCH 5.0: one zerocopy view per message type, a decoder and an encoder.
//!
//! Owns the byte layouts of the specification and nothing else: framing (BinaryFILE,
//! MoldUDP64) lives in [`crate::binaryfile`] and [`crate::moldudp64`], book logic in [`crate::book`].
//!
//! Every message is a `#[repr(C)]` struct of byte-aligned fields (big-endian integers from
//! `zerocopy::byteorder`), so a view over received bytes costs one length check and no copy.
//! The size of each struct is asserted at compile time against the specification.
//!
//! Encoding is the same structs built as values: [`Message::as_bytes`] (or
//! `zerocopy::IntoBytes::as_bytes` on a struct) gives the wire bytes.

mod json;
mod messages;

pub use json::to_json;
pub use messages::*;

use zerocopy::FromBytes;

/// Why [`decode`] could not produce a message. Small and `Copy`: the decoder runs per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// No bytes at all.
    #[error("empty input")]
    Empty,
    /// The first byte is not an ITCH 5.0 message type.
    #[error("unknown ITCH message type 0x{0:02x}")]
    UnknownType(u8),
    /// Fewer bytes than the type needs.
    #[error("truncated ITCH '{}' message: need {need} bytes, have {have}", *.message_type as char)]
    Truncated {
        /// The message type byte.
        message_type: u8,
        /// Size of that type in the specification.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A framed message whose frame length contradicts its type (see [`decode_exact`]).
    #[error("ITCH '{}' message is {expected} bytes but its frame holds {got}", *.message_type as char)]
    LengthMismatch {
        /// The message type byte.
        message_type: u8,
        /// Size of that type in the specification.
        expected: usize,
        /// Length given by the frame.
        got: usize,
    },
}

/// Size in bytes of the message whose type byte is `message_type`, or `None` for an unknown type.
pub const fn message_size(message_type: u8) -> Option<usize> {
    Some(match message_type {
        SystemEvent::TYPE => SystemEvent::SIZE,
        StockDirectory::TYPE => StockDirectory::SIZE,
        StockTradingAction::TYPE => StockTradingAction::SIZE,
        RegShoRestriction::TYPE => RegShoRestriction::SIZE,
        MarketParticipantPosition::TYPE => MarketParticipantPosition::SIZE,
        MwcbDeclineLevel::TYPE => MwcbDeclineLevel::SIZE,
        MwcbStatus::TYPE => MwcbStatus::SIZE,
        IpoQuotingPeriodUpdate::TYPE => IpoQuotingPeriodUpdate::SIZE,
        LuldAuctionCollar::TYPE => LuldAuctionCollar::SIZE,
        OperationalHalt::TYPE => OperationalHalt::SIZE,
        AddOrder::TYPE => AddOrder::SIZE,
        AddOrderMpid::TYPE => AddOrderMpid::SIZE,
        OrderExecuted::TYPE => OrderExecuted::SIZE,
        OrderExecutedWithPrice::TYPE => OrderExecutedWithPrice::SIZE,
        OrderCancel::TYPE => OrderCancel::SIZE,
        OrderDelete::TYPE => OrderDelete::SIZE,
        OrderReplace::TYPE => OrderReplace::SIZE,
        Trade::TYPE => Trade::SIZE,
        CrossTrade::TYPE => CrossTrade::SIZE,
        BrokenTrade::TYPE => BrokenTrade::SIZE,
        Noii::TYPE => Noii::SIZE,
        Rpii::TYPE => Rpii::SIZE,
        Dlcr::TYPE => Dlcr::SIZE,
        _ => return None,
    })
}

/// A decoded ITCH 5.0 message: a borrowed view of the input bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is the message of the same name
pub enum Message<'a> {
    SystemEvent(&'a SystemEvent),
    StockDirectory(&'a StockDirectory),
    StockTradingAction(&'a StockTradingAction),
    RegShoRestriction(&'a RegShoRestriction),
    MarketParticipantPosition(&'a MarketParticipantPosition),
    MwcbDeclineLevel(&'a MwcbDeclineLevel),
    MwcbStatus(&'a MwcbStatus),
    IpoQuotingPeriodUpdate(&'a IpoQuotingPeriodUpdate),
    LuldAuctionCollar(&'a LuldAuctionCollar),
    OperationalHalt(&'a OperationalHalt),
    AddOrder(&'a AddOrder),
    AddOrderMpid(&'a AddOrderMpid),
    OrderExecuted(&'a OrderExecuted),
    OrderExecutedWithPrice(&'a OrderExecutedWithPrice),
    OrderCancel(&'a OrderCancel),
    OrderDelete(&'a OrderDelete),
    OrderReplace(&'a OrderReplace),
    Trade(&'a Trade),
    CrossTrade(&'a CrossTrade),
    BrokenTrade(&'a BrokenTrade),
    Noii(&'a Noii),
    Rpii(&'a Rpii),
    Dlcr(&'a Dlcr),
}

macro_rules! for_each_variant {
    ($self:expr, $m:ident => $body:expr) => {
        match $self {
            Message::SystemEvent($m) => $body,
            Message::StockDirectory($m) => $body,
            Message::StockTradingAction($m) => $body,
            Message::RegShoRestriction($m) => $body,
            Message::MarketParticipantPosition($m) => $body,
            Message::MwcbDeclineLevel($m) => $body,
            Message::MwcbStatus($m) => $body,
            Message::IpoQuotingPeriodUpdate($m) => $body,
            Message::LuldAuctionCollar($m) => $body,
            Message::OperationalHalt($m) => $body,
            Message::AddOrder($m) => $body,
            Message::AddOrderMpid($m) => $body,
            Message::OrderExecuted($m) => $body,
            Message::OrderExecutedWithPrice($m) => $body,
            Message::OrderCancel($m) => $body,
            Message::OrderDelete($m) => $body,
            Message::OrderReplace($m) => $body,
            Message::Trade($m) => $body,
            Message::CrossTrade($m) => $body,
            Message::BrokenTrade($m) => $body,
            Message::Noii($m) => $body,
            Message::Rpii($m) => $body,
            Message::Dlcr($m) => $body,
        }
    };
}
pub(crate) use for_each_variant;

impl<'a> Message<'a> {
    /// The common header (type, stock locate, tracking number, timestamp).
    pub fn header(&self) -> &'a Header {
        for_each_variant!(*self, m => &m.header)
    }

    /// The message type byte, e.g. `b'A'`.
    pub fn message_type(&self) -> u8 {
        self.header().message_type
    }

    /// The wire bytes of the message (exactly its specification size).
    pub fn as_bytes(&self) -> &'a [u8] {
        for_each_variant!(*self, m => zerocopy::IntoBytes::as_bytes(m))
    }
}

/// Decodes the message at the start of `bytes`; returns it and the number of bytes it used.
///
/// Bytes after the message are ignored (the caller's framing decides what they are).
/// Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<(Message<'_>, usize), DecodeError> {
    let &message_type = bytes.first().ok_or(DecodeError::Empty)?;
    let size = message_size(message_type).ok_or(DecodeError::UnknownType(message_type))?;
    if bytes.len() < size {
        return Err(DecodeError::Truncated {
            message_type,
            need: size,
            have: bytes.len(),
        });
    }
    let b = &bytes[..size];
    // After the length check each view is exactly `size` bytes of align-1 fields, so
    // `ref_from_bytes` cannot fail; `view` maps the impossible error rather than unwrapping it.
    let message = match message_type {
        SystemEvent::TYPE => Message::SystemEvent(view(b)?),
        StockDirectory::TYPE => Message::StockDirectory(view(b)?),
        StockTradingAction::TYPE => Message::StockTradingAction(view(b)?),
        RegShoRestriction::TYPE => Message::RegShoRestriction(view(b)?),
        MarketParticipantPosition::TYPE => Message::MarketParticipantPosition(view(b)?),
        MwcbDeclineLevel::TYPE => Message::MwcbDeclineLevel(view(b)?),
        MwcbStatus::TYPE => Message::MwcbStatus(view(b)?),
        IpoQuotingPeriodUpdate::TYPE => Message::IpoQuotingPeriodUpdate(view(b)?),
        LuldAuctionCollar::TYPE => Message::LuldAuctionCollar(view(b)?),
        OperationalHalt::TYPE => Message::OperationalHalt(view(b)?),
        AddOrder::TYPE => Message::AddOrder(view(b)?),
        AddOrderMpid::TYPE => Message::AddOrderMpid(view(b)?),
        OrderExecuted::TYPE => Message::OrderExecuted(view(b)?),
        OrderExecutedWithPrice::TYPE => Message::OrderExecutedWithPrice(view(b)?),
        OrderCancel::TYPE => Message::OrderCancel(view(b)?),
        OrderDelete::TYPE => Message::OrderDelete(view(b)?),
        OrderReplace::TYPE => Message::OrderReplace(view(b)?),
        Trade::TYPE => Message::Trade(view(b)?),
        CrossTrade::TYPE => Message::CrossTrade(view(b)?),
        BrokenTrade::TYPE => Message::BrokenTrade(view(b)?),
        Noii::TYPE => Message::Noii(view(b)?),
        Rpii::TYPE => Message::Rpii(view(b)?),
        Dlcr::TYPE => Message::Dlcr(view(b)?),
        _ => return Err(DecodeError::UnknownType(message_type)),
    };
    Ok((message, size))
}

/// Decodes a framed message: `bytes` must be exactly one message of its type's size.
pub fn decode_exact(bytes: &[u8]) -> Result<Message<'_>, DecodeError> {
    let (message, size) = decode(bytes).map_err(|e| match e {
        // A frame shorter than its type is a contradiction of the frame, not a cut stream.
        DecodeError::Truncated {
            message_type,
            need,
            have,
        } => DecodeError::LengthMismatch {
            message_type,
            expected: need,
            got: have,
        },
        other => other,
    })?;
    if size != bytes.len() {
        return Err(DecodeError::LengthMismatch {
            message_type: message.message_type(),
            expected: size,
            got: bytes.len(),
        });
    }
    Ok(message)
}

fn view<T>(b: &[u8]) -> Result<&T, DecodeError>
where
    T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable,
{
    T::ref_from_bytes(b).map_err(|_| DecodeError::Truncated {
        message_type: b.first().copied().unwrap_or(0),
        need: core::mem::size_of::<T>(),
        have: b.len(),
    })
}

#[cfg(test)]
mod tests;
