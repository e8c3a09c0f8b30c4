//! The message layouts of TotalView-ITCH 5.0, field by field, in specification order.
//!
//! Field names are the specification's names in snake case; the JSON output of
//! `feed-handler decode` uses the same names. All one-byte fields are "Alpha" in the
//! specification and are kept as the raw byte.

// zerocopy's derives emit hidden field-marker types; inside `itch_message!` they take the
// macro's spans and trip this lint. Every type written here derives or implements Debug.
#![allow(missing_debug_implementations)]

use core::fmt;
use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Nanoseconds since midnight, as the 6-byte big-endian integer of the specification.
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Hash,
)]
#[repr(transparent)]
pub struct Timestamp(pub [u8; 6]);

impl Timestamp {
    /// Largest value the 48-bit field can hold.
    pub const MAX: u64 = (1 << 48) - 1;

    /// Nanoseconds since midnight.
    pub fn nanos(self) -> u64 {
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&self.0);
        u64::from_be_bytes(b)
    }

    /// From nanoseconds since midnight; values above [`Self::MAX`] keep their low 48 bits.
    pub fn from_nanos(nanos: u64) -> Self {
        let b = nanos.to_be_bytes();
        let mut t = [0u8; 6];
        t.copy_from_slice(&b[2..]);
        Self(t)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.nanos())
    }
}

pub use rocebus_md::Stock;

/// Price(4): an unsigned integer with 4 implied decimal places (`1234500` is 123.4500).
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Hash,
)]
#[repr(transparent)]
pub struct Price4(pub U32);

impl Price4 {
    /// From the integer in units of 1/10,000.
    pub fn new(raw: u32) -> Self {
        Self(U32::new(raw))
    }
    /// The integer in units of 1/10,000.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl fmt::Display for Price4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.get();
        write!(f, "{}.{:04}", v / 10_000, v % 10_000)
    }
}

impl fmt::Debug for Price4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Price(8): an unsigned integer with 8 implied decimal places (MWCB decline levels).
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Hash,
)]
#[repr(transparent)]
pub struct Price8(pub U64);

impl Price8 {
    /// From the integer in units of 1/100,000,000.
    pub fn new(raw: u64) -> Self {
        Self(U64::new(raw))
    }
    /// The integer in units of 1/100,000,000.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for Price8 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.get();
        write!(f, "{}.{:08}", v / 100_000_000, v % 100_000_000)
    }
}

impl fmt::Debug for Price8 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The 11 bytes every ITCH 5.0 message starts with.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, PartialEq, Eq, Debug,
)]
#[repr(C)]
pub struct Header {
    /// Message type byte, e.g. `b'A'`.
    pub message_type: u8,
    /// Locate code identifying the security (0 for messages about no security).
    pub stock_locate: U16,
    /// NASDAQ internal tracking number.
    pub tracking_number: U16,
    /// Nanoseconds since midnight.
    pub timestamp: Timestamp,
}
const _: () = assert!(core::mem::size_of::<Header>() == 11);

impl Header {
    /// A header for a message of type `message_type`.
    pub fn new(
        message_type: u8,
        stock_locate: u16,
        tracking_number: u16,
        timestamp_ns: u64,
    ) -> Self {
        Self {
            message_type,
            stock_locate: U16::new(stock_locate),
            tracking_number: U16::new(tracking_number),
            timestamp: Timestamp::from_nanos(timestamp_ns),
        }
    }
}

macro_rules! itch_message {
    (
        $(#[$m:meta])*
        $name:ident = $ty:literal, $size:literal {
            $( $(#[$fm:meta])* $field:ident : $t:ty, )*
        }
    ) => {
        $(#[$m])*
        #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(C)]
        pub struct $name {
            /// Common header; `header.message_type` is [`Self::TYPE`].
            pub header: Header,
            $( $(#[$fm])* pub $field: $t, )*
        }

        impl $name {
            /// The message type byte.
            pub const TYPE: u8 = $ty;
            /// The message size in bytes, from the specification.
            pub const SIZE: usize = $size;

            /// Names and JSON values of the fields after the header, in wire order.
            pub(crate) fn json_fields(&self, out: &mut serde_json::Map<String, serde_json::Value>) {
                $( out.insert(stringify!($field).to_owned(), super::json::JsonField::json(&self.$field)); )*
            }
        }

        const _: () = assert!(core::mem::size_of::<$name>() == $size);
    };
}

itch_message! {
    /// 'S' System Event (1.1).
    SystemEvent = b'S', 12 {
        /// 'O' start of messages, 'S' start of system hours, 'Q' start of market hours,
        /// 'M' end of market hours, 'E' end of system hours, 'C' end of messages.
        event_code: u8,
    }
}

itch_message! {
    /// 'R' Stock Directory (1.2.1).
    StockDirectory = b'R', 39 {
        /// Security symbol.
        stock: Stock,
        /// Listing market: 'Q', 'G', 'S', 'N', 'A', 'P', 'Z', 'V' or ' '.
        market_category: u8,
        /// NASDAQ financial status, ' ' when not NASDAQ-listed.
        financial_status_indicator: u8,
        /// Shares in a round lot.
        round_lot_size: U32,
        /// 'Y' when only round lots are accepted.
        round_lots_only: u8,
        /// Security class.
        issue_classification: u8,
        /// Issue sub-type (two Alpha characters; blank in some captures).
        issue_sub_type: [u8; 2],
        /// 'P' live/production, 'T' test.
        authenticity: u8,
        /// 'Y', 'N' or ' '.
        short_sale_threshold_indicator: u8,
        /// 'Y', 'N' or ' '.
        ipo_flag: u8,
        /// '1', '2' or ' '.
        luld_reference_price_tier: u8,
        /// 'Y', 'N' or ' '.
        etp_flag: u8,
        /// Leverage factor of an ETP.
        etp_leverage_factor: U32,
        /// 'Y' for an inverse ETP.
        inverse_indicator: u8,
    }
}

itch_message! {
    /// 'H' Stock Trading Action (1.2.2).
    StockTradingAction = b'H', 25 {
        /// Security symbol.
        stock: Stock,
        /// 'H' halted, 'P' paused, 'Q' quotation only, 'T' trading.
        trading_state: u8,
        /// Reserved.
        reserved: u8,
        /// Reason code (four Alpha characters).
        reason: [u8; 4],
    }
}

itch_message! {
    /// 'Y' Reg SHO Short Sale Price Test Restricted Indicator (1.2.3).
    RegShoRestriction = b'Y', 20 {
        /// Security symbol.
        stock: Stock,
        /// '0' no test, '1' in effect (intraday drop), '2' remains in effect.
        reg_sho_action: u8,
    }
}

itch_message! {
    /// 'L' Market Participant Position (1.2.4).
    MarketParticipantPosition = b'L', 26 {
        /// Market participant identifier.
        mpid: [u8; 4],
        /// Security symbol.
        stock: Stock,
        /// 'Y' or 'N'.
        primary_market_maker: u8,
        /// 'N', 'P', 'S', 'R' or 'L'.
        market_maker_mode: u8,
        /// 'A', 'E', 'W', 'S' or 'D'.
        market_participant_state: u8,
    }
}

itch_message! {
    /// 'V' MWCB Decline Level (1.2.5.1); prices are Price(8).
    MwcbDeclineLevel = b'V', 35 {
        /// Level 1 decline price.
        level_1: Price8,
        /// Level 2 decline price.
        level_2: Price8,
        /// Level 3 decline price.
        level_3: Price8,
    }
}

itch_message! {
    /// 'W' MWCB Status (1.2.5.2).
    MwcbStatus = b'W', 12 {
        /// '1', '2' or '3'.
        breached_level: u8,
    }
}

itch_message! {
    /// 'K' IPO Quoting Period Update (1.2.6).
    IpoQuotingPeriodUpdate = b'K', 28 {
        /// Security symbol.
        stock: Stock,
        /// Seconds since midnight of the anticipated release.
        ipo_quotation_release_time: U32,
        /// 'A' anticipated time, 'C' canceled or postponed.
        ipo_quotation_release_qualifier: u8,
        /// IPO price.
        ipo_price: Price4,
    }
}

itch_message! {
    /// 'J' LULD Auction Collar (1.2.7).
    LuldAuctionCollar = b'J', 35 {
        /// Security symbol.
        stock: Stock,
        /// Reference price for the collars.
        auction_collar_reference_price: Price4,
        /// Upper collar.
        upper_auction_collar_price: Price4,
        /// Lower collar.
        lower_auction_collar_price: Price4,
        /// Number of extensions to the reopening auction.
        auction_collar_extension: U32,
    }
}

itch_message! {
    /// 'h' Operational Halt (1.2.8).
    OperationalHalt = b'h', 21 {
        /// Security symbol.
        stock: Stock,
        /// 'Q' NASDAQ, 'B' BX, 'X' PSX.
        market_code: u8,
        /// 'H' halted, 'T' resumed.
        operational_halt_action: u8,
    }
}

itch_message! {
    /// 'A' Add Order, no MPID attribution (1.3.1).
    AddOrder = b'A', 36 {
        /// Day-unique order reference.
        order_reference_number: U64,
        /// 'B' buy, 'S' sell.
        buy_sell_indicator: u8,
        /// Displayed shares.
        shares: U32,
        /// Security symbol.
        stock: Stock,
        /// Limit price.
        price: Price4,
    }
}

itch_message! {
    /// 'F' Add Order with MPID attribution (1.3.2).
    AddOrderMpid = b'F', 40 {
        /// Day-unique order reference.
        order_reference_number: U64,
        /// 'B' buy, 'S' sell.
        buy_sell_indicator: u8,
        /// Displayed shares.
        shares: U32,
        /// Security symbol.
        stock: Stock,
        /// Limit price.
        price: Price4,
        /// Market participant identifier.
        attribution: [u8; 4],
    }
}

itch_message! {
    /// 'E' Order Executed (1.4.1): executed at the order's price.
    OrderExecuted = b'E', 31 {
        /// The resting order.
        order_reference_number: U64,
        /// Shares executed.
        executed_shares: U32,
        /// Day-unique match number.
        match_number: U64,
    }
}

itch_message! {
    /// 'C' Order Executed With Price (1.4.2).
    OrderExecutedWithPrice = b'C', 36 {
        /// The resting order.
        order_reference_number: U64,
        /// Shares executed.
        executed_shares: U32,
        /// Day-unique match number.
        match_number: U64,
        /// 'Y' printable, 'N' not (counted elsewhere).
        printable: u8,
        /// Execution price.
        execution_price: Price4,
    }
}

itch_message! {
    /// 'X' Order Cancel (1.4.3): partial cancel.
    OrderCancel = b'X', 23 {
        /// The resting order.
        order_reference_number: U64,
        /// Shares removed.
        cancelled_shares: U32,
    }
}

itch_message! {
    /// 'D' Order Delete (1.4.4).
    OrderDelete = b'D', 19 {
        /// The resting order.
        order_reference_number: U64,
    }
}

itch_message! {
    /// 'U' Order Replace (1.4.5): deletes the original and adds a new order, same side.
    OrderReplace = b'U', 35 {
        /// The order being replaced.
        original_order_reference_number: U64,
        /// The new order.
        new_order_reference_number: U64,
        /// Displayed shares of the new order.
        shares: U32,
        /// Price of the new order.
        price: Price4,
    }
}

itch_message! {
    /// 'P' Trade, non-cross (1.5.1): a match against a non-displayed order.
    Trade = b'P', 44 {
        /// Always 0 since 2014 (non-displayed order).
        order_reference_number: U64,
        /// 'B' buy, 'S' sell (side of the non-displayed order).
        buy_sell_indicator: u8,
        /// Shares.
        shares: U32,
        /// Security symbol.
        stock: Stock,
        /// Match price.
        price: Price4,
        /// Day-unique match number.
        match_number: U64,
    }
}

itch_message! {
    /// 'Q' Cross Trade (1.5.2).
    CrossTrade = b'Q', 40 {
        /// Shares matched in the cross (8 bytes in 5.0).
        shares: U64,
        /// Security symbol.
        stock: Stock,
        /// Cross price.
        cross_price: Price4,
        /// Day-unique match number.
        match_number: U64,
        /// 'O' opening, 'C' closing, 'H' halt/IPO, 'I' intraday.
        cross_type: u8,
    }
}

itch_message! {
    /// 'B' Broken Trade (1.5.3).
    BrokenTrade = b'B', 19 {
        /// The match number of the broken execution.
        match_number: U64,
    }
}

itch_message! {
    /// 'I' Net Order Imbalance Indicator (1.6).
    Noii = b'I', 50 {
        /// Shares paired at the current reference price.
        paired_shares: U64,
        /// Shares not paired.
        imbalance_shares: U64,
        /// 'B', 'S', 'N' or 'O'.
        imbalance_direction: u8,
        /// Security symbol.
        stock: Stock,
        /// Far price.
        far_price: Price4,
        /// Near price.
        near_price: Price4,
        /// Current reference price.
        current_reference_price: Price4,
        /// 'O', 'C' or 'H'.
        cross_type: u8,
        /// Deviation of the near price from the reference ('L', '1'..'9', 'A'..'C', ' ').
        price_variation_indicator: u8,
    }
}

itch_message! {
    /// 'N' Retail Price Improvement Indicator (1.7).
    Rpii = b'N', 20 {
        /// Security symbol.
        stock: Stock,
        /// 'B', 'S', 'A' or 'N'.
        interest_flag: u8,
    }
}

itch_message! {
    /// 'O' Direct Listing with Capital Raise Price Discovery (1.8).
    Dlcr = b'O', 48 {
        /// Security symbol.
        stock: Stock,
        /// 'N' not eligible, 'Y' eligible.
        open_eligibility_status: u8,
        /// Minimum allowable price.
        minimum_allowable_price: Price4,
        /// Maximum allowable price.
        maximum_allowable_price: Price4,
        /// Near execution price.
        near_execution_price: Price4,
        /// Nanoseconds since midnight of the near execution price.
        near_execution_time: U64,
        /// Lower price range collar.
        lower_price_range_collar: Price4,
        /// Upper price range collar.
        upper_price_range_collar: Price4,
    }
}
