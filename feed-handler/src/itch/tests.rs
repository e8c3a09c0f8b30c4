//! Fixed-byte tests: each message written out byte by byte from the specification's layout,
//! decoded, checked field by field, and re-encoded from values to the same bytes.
// Byte-by-byte arrays with a comment per field are the point of these fixtures.
#![allow(clippy::byte_char_slices)]

use super::*;
use zerocopy::byteorder::big_endian::{U32, U64};
use zerocopy::IntoBytes;

/// Common header bytes: stock locate 7, tracking number 2, timestamp 0x12345678 ns.
const HEADER_TAIL: [u8; 10] = [0x00, 0x07, 0x00, 0x02, 0x00, 0x00, 0x12, 0x34, 0x56, 0x78];
const TS: u64 = 0x1234_5678;

fn msg(message_type: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![message_type];
    v.extend_from_slice(&HEADER_TAIL);
    v.extend_from_slice(body);
    v
}

fn hdr(message_type: u8) -> Header {
    Header::new(message_type, 7, 2, TS)
}

/// Decodes `bytes`, checks size/type/header/`decode_exact` and the truncation error, and returns the view.
fn check<'a>(bytes: &'a [u8], size: usize) -> Message<'a> {
    assert_eq!(bytes.len(), size, "fixture length");
    assert_eq!(message_size(bytes[0]), Some(size));
    let (m, used) = decode(bytes).expect("decodes");
    assert_eq!(used, size);
    assert_eq!(m.as_bytes(), bytes);
    assert_eq!(m.header().stock_locate.get(), 7);
    assert_eq!(m.header().tracking_number.get(), 2);
    assert_eq!(m.header().timestamp.nanos(), TS);
    assert_eq!(decode_exact(bytes).expect("exact"), m);
    assert_eq!(
        decode(&bytes[..size - 1]),
        Err(DecodeError::Truncated {
            message_type: bytes[0],
            need: size,
            have: size - 1
        })
    );
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert_eq!(
        decode(&longer).map(|(_, n)| n),
        Ok(size),
        "trailing bytes are not consumed"
    );
    assert_eq!(
        decode_exact(&longer),
        Err(DecodeError::LengthMismatch {
            message_type: bytes[0],
            expected: size,
            got: size + 1
        })
    );
    m
}

#[test]
fn system_event() {
    let b = msg(b'S', &[b'O']);
    let Message::SystemEvent(m) = check(&b, 12) else {
        panic!("variant")
    };
    assert_eq!(m.event_code, b'O');
    let v = SystemEvent {
        header: hdr(b'S'),
        event_code: b'O',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn stock_directory() {
    #[rustfmt::skip]
    let b = msg(b'R', &[
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ', // stock
        b'Q',                                           // market category
        b'N',                                           // financial status
        0x00, 0x00, 0x00, 0x64,                         // round lot size 100
        b'N',                                           // round lots only
        b'C',                                           // issue classification
        b'Z', b' ',                                     // issue sub-type
        b'P',                                           // authenticity
        b'N',                                           // short sale threshold
        b'N',                                           // IPO flag
        b'1',                                           // LULD tier
        b'N',                                           // ETP flag
        0x00, 0x00, 0x00, 0x02,                         // ETP leverage factor
        b'N',                                           // inverse indicator
    ]);
    let Message::StockDirectory(m) = check(&b, 39) else {
        panic!("variant")
    };
    assert_eq!(m.stock.as_str(), Some("AAPL"));
    assert_eq!(m.market_category, b'Q');
    assert_eq!(m.round_lot_size.get(), 100);
    assert_eq!(&m.issue_sub_type, b"Z ");
    assert_eq!(m.luld_reference_price_tier, b'1');
    assert_eq!(m.etp_leverage_factor.get(), 2);
    assert_eq!(m.inverse_indicator, b'N');
    let v = StockDirectory {
        header: hdr(b'R'),
        stock: Stock::new("AAPL"),
        market_category: b'Q',
        financial_status_indicator: b'N',
        round_lot_size: U32::new(100),
        round_lots_only: b'N',
        issue_classification: b'C',
        issue_sub_type: *b"Z ",
        authenticity: b'P',
        short_sale_threshold_indicator: b'N',
        ipo_flag: b'N',
        luld_reference_price_tier: b'1',
        etp_flag: b'N',
        etp_leverage_factor: U32::new(2),
        inverse_indicator: b'N',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn stock_trading_action() {
    #[rustfmt::skip]
    let b = msg(b'H', &[
        b'M', b'S', b'F', b'T', b' ', b' ', b' ', b' ', // stock
        b'H',                                           // trading state
        b' ',                                           // reserved
        b'L', b'U', b'D', b'P',                         // reason
    ]);
    let Message::StockTradingAction(m) = check(&b, 25) else {
        panic!("variant")
    };
    assert_eq!(m.stock.as_str(), Some("MSFT"));
    assert_eq!(m.trading_state, b'H');
    assert_eq!(&m.reason, b"LUDP");
    let v = StockTradingAction {
        header: hdr(b'H'),
        stock: Stock::new("MSFT"),
        trading_state: b'H',
        reserved: b' ',
        reason: *b"LUDP",
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn reg_sho_restriction() {
    let b = msg(
        b'Y',
        &[b'I', b'B', b'M', b' ', b' ', b' ', b' ', b' ', b'1'],
    );
    let Message::RegShoRestriction(m) = check(&b, 20) else {
        panic!("variant")
    };
    assert_eq!(m.stock.as_str(), Some("IBM"));
    assert_eq!(m.reg_sho_action, b'1');
    let v = RegShoRestriction {
        header: hdr(b'Y'),
        stock: Stock::new("IBM"),
        reg_sho_action: b'1',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn market_participant_position() {
    #[rustfmt::skip]
    let b = msg(b'L', &[
        b'G', b'S', b'C', b'O',                         // MPID
        b'I', b'B', b'M', b' ', b' ', b' ', b' ', b' ', // stock
        b'Y', b'N', b'A',                               // primary MM, mode, state
    ]);
    let Message::MarketParticipantPosition(m) = check(&b, 26) else {
        panic!("variant")
    };
    assert_eq!(&m.mpid, b"GSCO");
    assert_eq!(m.stock.as_str(), Some("IBM"));
    assert_eq!(
        (
            m.primary_market_maker,
            m.market_maker_mode,
            m.market_participant_state
        ),
        (b'Y', b'N', b'A')
    );
    let v = MarketParticipantPosition {
        header: hdr(b'L'),
        mpid: *b"GSCO",
        stock: Stock::new("IBM"),
        primary_market_maker: b'Y',
        market_maker_mode: b'N',
        market_participant_state: b'A',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn mwcb_decline_level() {
    #[rustfmt::skip]
    let b = msg(b'V', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // level 1: 0.00000001
        0x00, 0x00, 0x00, 0x00, 0x05, 0xf5, 0xe1, 0x00, // level 2: 1.00000000
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // level 3: 42.94967296
    ]);
    let Message::MwcbDeclineLevel(m) = check(&b, 35) else {
        panic!("variant")
    };
    assert_eq!(m.level_1.to_string(), "0.00000001");
    assert_eq!(m.level_2.to_string(), "1.00000000");
    assert_eq!(m.level_3.get(), 1 << 32);
    assert_eq!(m.level_3.to_string(), "42.94967296");
    let v = MwcbDeclineLevel {
        header: hdr(b'V'),
        level_1: Price8::new(1),
        level_2: Price8::new(100_000_000),
        level_3: Price8::new(1 << 32),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn mwcb_status() {
    let b = msg(b'W', &[b'2']);
    let Message::MwcbStatus(m) = check(&b, 12) else {
        panic!("variant")
    };
    assert_eq!(m.breached_level, b'2');
    assert_eq!(
        MwcbStatus {
            header: hdr(b'W'),
            breached_level: b'2'
        }
        .as_bytes(),
        &b[..]
    );
}

#[test]
fn ipo_quoting_period_update() {
    #[rustfmt::skip]
    let b = msg(b'K', &[
        b'N', b'E', b'W', b'C', b'O', b' ', b' ', b' ', // stock
        0x00, 0x00, 0x8c, 0xa0,                         // release time 36000 s (10:00)
        b'A',                                           // qualifier
        0x00, 0x02, 0xbf, 0x20,                         // IPO price 18.0000
    ]);
    let Message::IpoQuotingPeriodUpdate(m) = check(&b, 28) else {
        panic!("variant")
    };
    assert_eq!(m.stock.as_str(), Some("NEWCO"));
    assert_eq!(m.ipo_quotation_release_time.get(), 36_000);
    assert_eq!(m.ipo_quotation_release_qualifier, b'A');
    assert_eq!(m.ipo_price.to_string(), "18.0000");
    let v = IpoQuotingPeriodUpdate {
        header: hdr(b'K'),
        stock: Stock::new("NEWCO"),
        ipo_quotation_release_time: U32::new(36_000),
        ipo_quotation_release_qualifier: b'A',
        ipo_price: Price4::new(180_000),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn luld_auction_collar() {
    #[rustfmt::skip]
    let b = msg(b'J', &[
        b'X', b'Y', b'Z', b' ', b' ', b' ', b' ', b' ', // stock
        0x00, 0x0f, 0x42, 0x40,                         // reference 100.0000
        0x00, 0x10, 0xc8, 0xe0,                         // upper 110.0000
        0x00, 0x0d, 0xbb, 0xa0,                         // lower 90.0000
        0x00, 0x00, 0x00, 0x03,                         // extension 3
    ]);
    let Message::LuldAuctionCollar(m) = check(&b, 35) else {
        panic!("variant")
    };
    assert_eq!(m.auction_collar_reference_price.get(), 1_000_000);
    assert_eq!(m.upper_auction_collar_price.get(), 1_100_000);
    assert_eq!(m.lower_auction_collar_price.get(), 900_000);
    assert_eq!(m.auction_collar_extension.get(), 3);
    let v = LuldAuctionCollar {
        header: hdr(b'J'),
        stock: Stock::new("XYZ"),
        auction_collar_reference_price: Price4::new(1_000_000),
        upper_auction_collar_price: Price4::new(1_100_000),
        lower_auction_collar_price: Price4::new(900_000),
        auction_collar_extension: U32::new(3),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn operational_halt() {
    let b = msg(
        b'h',
        &[b'X', b'Y', b'Z', b' ', b' ', b' ', b' ', b' ', b'Q', b'H'],
    );
    let Message::OperationalHalt(m) = check(&b, 21) else {
        panic!("variant")
    };
    assert_eq!((m.market_code, m.operational_halt_action), (b'Q', b'H'));
    let v = OperationalHalt {
        header: hdr(b'h'),
        stock: Stock::new("XYZ"),
        market_code: b'Q',
        operational_halt_action: b'H',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn add_order() {
    #[rustfmt::skip]
    let b = msg(b'A', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x39, // order ref 12345
        b'B',                                           // side
        0x00, 0x00, 0x01, 0x2c,                         // shares 300
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ', // stock
        0x00, 0x12, 0xd6, 0x76,                         // price 123.4550
    ]);
    let Message::AddOrder(m) = check(&b, 36) else {
        panic!("variant")
    };
    assert_eq!(m.order_reference_number.get(), 12345);
    assert_eq!(m.buy_sell_indicator, b'B');
    assert_eq!(m.shares.get(), 300);
    assert_eq!(m.price.get(), 1_234_550);
    assert_eq!(m.price.to_string(), "123.4550");
    let v = AddOrder {
        header: hdr(b'A'),
        order_reference_number: U64::new(12345),
        buy_sell_indicator: b'B',
        shares: U32::new(300),
        stock: Stock::new("AAPL"),
        price: Price4::new(1_234_550),
    };
    assert_eq!(v.as_bytes(), &b[..]);
    let j = to_json(&Message::AddOrder(m));
    assert_eq!(
        j.to_string(),
        r#"{"type":"A","stock_locate":7,"tracking_number":2,"timestamp":305419896,"order_reference_number":12345,"buy_sell_indicator":"B","shares":300,"stock":"AAPL","price":"123.4550"}"#
    );
}

#[test]
fn add_order_mpid() {
    #[rustfmt::skip]
    let b = msg(b'F', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x3a, // order ref 12346
        b'S',                                           // side
        0x00, 0x00, 0x00, 0x64,                         // shares 100
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ', // stock
        0x00, 0x00, 0x27, 0x10,                         // price 1.0000
        b'N', b'S', b'D', b'Q',                         // attribution
    ]);
    let Message::AddOrderMpid(m) = check(&b, 40) else {
        panic!("variant")
    };
    assert_eq!(m.order_reference_number.get(), 12346);
    assert_eq!(&m.attribution, b"NSDQ");
    let v = AddOrderMpid {
        header: hdr(b'F'),
        order_reference_number: U64::new(12346),
        buy_sell_indicator: b'S',
        shares: U32::new(100),
        stock: Stock::new("AAPL"),
        price: Price4::new(10_000),
        attribution: *b"NSDQ",
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn order_executed() {
    #[rustfmt::skip]
    let b = msg(b'E', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x39, // order ref
        0x00, 0x00, 0x00, 0x32,                         // executed 50
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // match 65536
    ]);
    let Message::OrderExecuted(m) = check(&b, 31) else {
        panic!("variant")
    };
    assert_eq!(m.executed_shares.get(), 50);
    assert_eq!(m.match_number.get(), 65536);
    let v = OrderExecuted {
        header: hdr(b'E'),
        order_reference_number: U64::new(12345),
        executed_shares: U32::new(50),
        match_number: U64::new(65536),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn order_executed_with_price() {
    #[rustfmt::skip]
    let b = msg(b'C', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x39, // order ref
        0x00, 0x00, 0x00, 0x0a,                         // executed 10
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // match 7
        b'Y',                                           // printable
        0x00, 0x12, 0xd6, 0x76,                         // price 123.4550
    ]);
    let Message::OrderExecutedWithPrice(m) = check(&b, 36) else {
        panic!("variant")
    };
    assert_eq!(m.printable, b'Y');
    assert_eq!(m.execution_price.get(), 1_234_550);
    let v = OrderExecutedWithPrice {
        header: hdr(b'C'),
        order_reference_number: U64::new(12345),
        executed_shares: U32::new(10),
        match_number: U64::new(7),
        printable: b'Y',
        execution_price: Price4::new(1_234_550),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn order_cancel() {
    #[rustfmt::skip]
    let b = msg(b'X', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x39, // order ref
        0x00, 0x00, 0x00, 0x19,                         // cancelled 25
    ]);
    let Message::OrderCancel(m) = check(&b, 23) else {
        panic!("variant")
    };
    assert_eq!(m.cancelled_shares.get(), 25);
    let v = OrderCancel {
        header: hdr(b'X'),
        order_reference_number: U64::new(12345),
        cancelled_shares: U32::new(25),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn order_delete() {
    let b = msg(b'D', &[0xff, 0, 0, 0, 0, 0, 0, 0x01]);
    let Message::OrderDelete(m) = check(&b, 19) else {
        panic!("variant")
    };
    assert_eq!(m.order_reference_number.get(), 0xff00_0000_0000_0001);
    let v = OrderDelete {
        header: hdr(b'D'),
        order_reference_number: U64::new(0xff00_0000_0000_0001),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn order_replace() {
    #[rustfmt::skip]
    let b = msg(b'U', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x39, // original 12345
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x40, // new 12352
        0x00, 0x00, 0x00, 0xc8,                         // shares 200
        0x00, 0x12, 0xd6, 0x80,                         // price 123.4560
    ]);
    let Message::OrderReplace(m) = check(&b, 35) else {
        panic!("variant")
    };
    assert_eq!(m.original_order_reference_number.get(), 12345);
    assert_eq!(m.new_order_reference_number.get(), 12352);
    assert_eq!(m.shares.get(), 200);
    assert_eq!(m.price.get(), 1_234_560);
    let v = OrderReplace {
        header: hdr(b'U'),
        original_order_reference_number: U64::new(12345),
        new_order_reference_number: U64::new(12352),
        shares: U32::new(200),
        price: Price4::new(1_234_560),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn trade() {
    #[rustfmt::skip]
    let b = msg(b'P', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // order ref 0
        b'S',                                           // side
        0x00, 0x00, 0x03, 0xe8,                         // shares 1000
        b'M', b'E', b'A', b'T', b' ', b' ', b' ', b' ', // stock
        0x00, 0x01, 0x86, 0xa0,                         // price 10.0000
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, // match 9
    ]);
    let Message::Trade(m) = check(&b, 44) else {
        panic!("variant")
    };
    assert_eq!(m.shares.get(), 1000);
    assert_eq!(m.stock.as_str(), Some("MEAT"));
    assert_eq!(m.price.to_string(), "10.0000");
    assert_eq!(m.match_number.get(), 9);
    let v = Trade {
        header: hdr(b'P'),
        order_reference_number: U64::new(0),
        buy_sell_indicator: b'S',
        shares: U32::new(1000),
        stock: Stock::new("MEAT"),
        price: Price4::new(100_000),
        match_number: U64::new(9),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn cross_trade() {
    #[rustfmt::skip]
    let b = msg(b'Q', &[
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // shares 2^32
        b'M', b'E', b'A', b'T', b' ', b' ', b' ', b' ', // stock
        0x00, 0x01, 0x86, 0xa0,                         // cross price 10.0000
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, // match 10
        b'O',                                           // cross type
    ]);
    let Message::CrossTrade(m) = check(&b, 40) else {
        panic!("variant")
    };
    assert_eq!(m.shares.get(), 1 << 32);
    assert_eq!(m.cross_price.get(), 100_000);
    assert_eq!(m.cross_type, b'O');
    let v = CrossTrade {
        header: hdr(b'Q'),
        shares: U64::new(1 << 32),
        stock: Stock::new("MEAT"),
        cross_price: Price4::new(100_000),
        match_number: U64::new(10),
        cross_type: b'O',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn broken_trade() {
    let b = msg(b'B', &[0, 0, 0, 0, 0, 0, 0, 0x0a]);
    let Message::BrokenTrade(m) = check(&b, 19) else {
        panic!("variant")
    };
    assert_eq!(m.match_number.get(), 10);
    assert_eq!(
        BrokenTrade {
            header: hdr(b'B'),
            match_number: U64::new(10)
        }
        .as_bytes(),
        &b[..]
    );
}

#[test]
fn noii() {
    #[rustfmt::skip]
    let b = msg(b'I', &[
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xe8, // paired 1000
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xf4, // imbalance 500
        b'B',                                           // direction
        b'M', b'E', b'A', b'T', b' ', b' ', b' ', b' ', // stock
        0x00, 0x01, 0x86, 0xa0,                         // far 10.0000
        0x00, 0x01, 0x87, 0x04,                         // near 10.0100
        0x00, 0x01, 0x86, 0xd2,                         // reference 10.0050
        b'O',                                           // cross type
        b'L',                                           // price variation
    ]);
    let Message::Noii(m) = check(&b, 50) else {
        panic!("variant")
    };
    assert_eq!(m.paired_shares.get(), 1000);
    assert_eq!(m.imbalance_shares.get(), 500);
    assert_eq!(m.imbalance_direction, b'B');
    assert_eq!(m.near_price.to_string(), "10.0100");
    assert_eq!(m.current_reference_price.to_string(), "10.0050");
    assert_eq!(m.price_variation_indicator, b'L');
    let v = Noii {
        header: hdr(b'I'),
        paired_shares: U64::new(1000),
        imbalance_shares: U64::new(500),
        imbalance_direction: b'B',
        stock: Stock::new("MEAT"),
        far_price: Price4::new(100_000),
        near_price: Price4::new(100_100),
        current_reference_price: Price4::new(100_050),
        cross_type: b'O',
        price_variation_indicator: b'L',
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn rpii() {
    let b = msg(
        b'N',
        &[b'M', b'E', b'A', b'T', b' ', b' ', b' ', b' ', b'A'],
    );
    let Message::Rpii(m) = check(&b, 20) else {
        panic!("variant")
    };
    assert_eq!(m.interest_flag, b'A');
    assert_eq!(
        Rpii {
            header: hdr(b'N'),
            stock: Stock::new("MEAT"),
            interest_flag: b'A'
        }
        .as_bytes(),
        &b[..]
    );
}

#[test]
fn dlcr() {
    #[rustfmt::skip]
    let b = msg(b'O', &[
        b'D', b'L', b'C', b'R', b' ', b' ', b' ', b' ', // stock
        b'Y',                                           // open eligibility
        0x00, 0x01, 0x86, 0xa0,                         // min 10.0000
        0x00, 0x03, 0x0d, 0x40,                         // max 20.0000
        0x00, 0x02, 0x49, 0xf0,                         // near 15.0000
        0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x78, // near execution time
        0x00, 0x02, 0x17, 0x28,                         // lower collar 13.7000
        0x00, 0x02, 0x7d, 0x80,                         // upper collar 16.3200
    ]);
    let Message::Dlcr(m) = check(&b, 48) else {
        panic!("variant")
    };
    assert_eq!(m.open_eligibility_status, b'Y');
    assert_eq!(m.minimum_allowable_price.get(), 100_000);
    assert_eq!(m.maximum_allowable_price.get(), 200_000);
    assert_eq!(m.near_execution_price.get(), 150_000);
    assert_eq!(m.near_execution_time.get(), 0x1234_5678);
    assert_eq!(m.lower_price_range_collar.to_string(), "13.7000");
    assert_eq!(m.upper_price_range_collar.to_string(), "16.3200");
    let v = Dlcr {
        header: hdr(b'O'),
        stock: Stock::new("DLCR"),
        open_eligibility_status: b'Y',
        minimum_allowable_price: Price4::new(100_000),
        maximum_allowable_price: Price4::new(200_000),
        near_execution_price: Price4::new(150_000),
        near_execution_time: U64::new(0x1234_5678),
        lower_price_range_collar: Price4::new(137_000),
        upper_price_range_collar: Price4::new(163_200),
    };
    assert_eq!(v.as_bytes(), &b[..]);
}

#[test]
fn sizes_match_the_specification() {
    let expected: [(u8, usize); 23] = [
        (b'S', 12),
        (b'R', 39),
        (b'H', 25),
        (b'Y', 20),
        (b'L', 26),
        (b'V', 35),
        (b'W', 12),
        (b'K', 28),
        (b'J', 35),
        (b'h', 21),
        (b'A', 36),
        (b'F', 40),
        (b'E', 31),
        (b'C', 36),
        (b'X', 23),
        (b'D', 19),
        (b'U', 35),
        (b'P', 44),
        (b'Q', 40),
        (b'B', 19),
        (b'I', 50),
        (b'N', 20),
        (b'O', 48),
    ];
    for (t, size) in expected {
        assert_eq!(message_size(t), Some(size), "type {}", t as char);
    }
    let known = (0..=255u8).filter(|&t| message_size(t).is_some()).count();
    assert_eq!(known, expected.len(), "no other type byte is known");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert_eq!(decode(&[]), Err(DecodeError::Empty));
    assert_eq!(decode(&[b'Z', 0, 0]), Err(DecodeError::UnknownType(b'Z')));
    assert_eq!(
        decode(&[b'A']),
        Err(DecodeError::Truncated {
            message_type: b'A',
            need: 36,
            have: 1
        })
    );
    assert_eq!(
        decode_exact(&[b'D', 0, 0]),
        Err(DecodeError::LengthMismatch {
            message_type: b'D',
            expected: 19,
            got: 3
        })
    );
    // Every prefix of every type and every type byte: no panic.
    for t in 0..=255u8 {
        let mut b = vec![t];
        b.resize(64, 0xAB);
        for n in 0..b.len() {
            let _ = decode(&b[..n]);
            let _ = decode_exact(&b[..n]);
        }
    }
}

#[test]
fn timestamp_roundtrip() {
    for ns in [0, 1, 34_200_000_000_000, Timestamp::MAX] {
        assert_eq!(Timestamp::from_nanos(ns).nanos(), ns);
    }
    assert_eq!(
        Timestamp::from_nanos(0x0102_0304_0506).0,
        [1, 2, 3, 4, 5, 6]
    );
}
