//! The value types every market-data consumer needs: a symbol, a side, a price level.

use core::fmt;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// An 8-byte stock symbol, left-justified and padded with spaces on the wire.
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
pub struct Stock(pub [u8; 8]);

impl Stock {
    /// Pads `symbol` with spaces (or cuts it) to 8 bytes.
    pub fn new(symbol: &str) -> Self {
        let mut s = [b' '; 8];
        for (d, c) in s.iter_mut().zip(symbol.bytes()) {
            *d = c;
        }
        Self(s)
    }

    /// The symbol without its padding; non-UTF-8 bytes come back as `None`.
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(&self.0)
            .ok()
            .map(|s| s.trim_end_matches(' '))
    }
}

impl fmt::Debug for Stock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(s) => write!(f, "{s:?}"),
            None => write!(f, "{:?}", self.0),
        }
    }
}

/// Side of an order or level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Buy ('B').
    Bid,
    /// Sell ('S').
    Ask,
}

impl Side {
    /// From the ITCH buy/sell indicator.
    pub fn from_itch(b: u8) -> Option<Self> {
        match b {
            b'B' => Some(Self::Bid),
            b'S' => Some(Self::Ask),
            _ => None,
        }
    }

    /// The ITCH buy/sell indicator.
    pub fn to_itch(self) -> u8 {
        match self {
            Self::Bid => b'B',
            Self::Ask => b'S',
        }
    }
}

/// One price level: aggregate of the orders at one price on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Price, 4 implied decimals.
    pub price: u32,
    /// Total displayed shares.
    pub shares: u64,
    /// Number of orders.
    pub orders: u32,
}
