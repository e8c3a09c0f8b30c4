//! The engine-side library: encodes requests, decodes responses and tracks the engine's own
//! orders. Engines embed it; it owns no transport (the caller moves the bytes).

use std::collections::HashMap;

use crate::proto::{
    msg_type, Cancel, DecodeError, MassCancel, NewOrder, RejectReason, Replace, Request, Response,
    Side, Symbol, TimeInForce,
};

/// Where an order stands, as the engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// Sent, no answer yet.
    PendingNew,
    /// Acknowledged by the venue, nothing executed.
    New,
    /// Partially executed.
    PartiallyFilled,
    /// Completely executed (final).
    Filled,
    /// Canceled (final).
    Canceled,
    /// Rejected (final).
    Rejected(RejectReason),
}

impl OrderState {
    /// True once no more responses can change the order.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OrderState::Filled | OrderState::Canceled | OrderState::Rejected(_)
        )
    }
}

/// One order as tracked by the client.
#[derive(Clone, Copy, Debug)]
pub struct OwnOrder {
    /// Instrument.
    pub symbol: Symbol,
    /// Side.
    pub side: Side,
    /// Total quantity (after replaces).
    pub qty: u32,
    /// Limit price (after replaces).
    pub price: i64,
    /// Executed quantity.
    pub cum_qty: u32,
    /// State.
    pub state: OrderState,
}

/// What a response did to the client's book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// The bytes are not a response.
    Decode(DecodeError),
    /// A response for an order this client never sent.
    UnknownOrder(u64),
    /// A response for an order already final (a duplicate answer).
    AlreadyFinal(u64),
}

/// Engine-side order client.
#[derive(Debug, Default)]
pub struct Client {
    next_id: u64,
    orders: HashMap<u64, OwnOrder>,
    position: HashMap<Symbol, i64>,
}

impl Client {
    /// A client whose first order id is `first_id` (ids must stay unique across restarts).
    pub fn new(first_id: u64) -> Client {
        Client {
            next_id: first_id,
            ..Client::default()
        }
    }

    /// Encodes a new order and starts tracking it; returns its id and frame.
    pub fn new_order(
        &mut self,
        account: u32,
        symbol: Symbol,
        side: Side,
        qty: u32,
        price: i64,
    ) -> (u64, NewOrder) {
        let id = self.next_id;
        self.next_id += 1;
        self.orders.insert(
            id,
            OwnOrder {
                symbol,
                side,
                qty,
                price,
                cum_qty: 0,
                state: OrderState::PendingNew,
            },
        );
        (
            id,
            NewOrder::new(id, account, symbol, side, qty, price, TimeInForce::Day),
        )
    }

    /// Encodes a cancel of `id`.
    pub fn cancel(&self, id: u64) -> Cancel {
        Cancel::new(id)
    }

    /// Encodes a replace of `id`.
    pub fn replace(&self, id: u64, qty: u32, price: i64) -> Replace {
        Replace::new(id, qty, price)
    }

    /// Encodes a mass cancel.
    pub fn mass_cancel(&self, account: u32, symbol: Symbol) -> MassCancel {
        MassCancel::new(account, symbol)
    }

    /// Applies one response frame; returns the decoded response.
    pub fn on_response(&mut self, bytes: &[u8]) -> Result<Response, ClientError> {
        let (resp, _) = Response::decode(bytes).map_err(ClientError::Decode)?;
        let id = resp.cl_ord_id();
        let o = self
            .orders
            .get_mut(&id)
            .ok_or(ClientError::UnknownOrder(id))?;
        if o.state.is_final() {
            return Err(ClientError::AlreadyFinal(id));
        }
        match resp {
            Response::Ack(_) => o.state = OrderState::New,
            Response::Reject(r) => {
                // Only a rejected new order is final; a rejected cancel/replace leaves it live.
                if r.request == msg_type::NEW_ORDER {
                    o.state = OrderState::Rejected(r.reason());
                }
            }
            Response::Fill(f) => {
                o.cum_qty = f.cum_qty.get();
                o.state = if f.leaves_qty.get() == 0 {
                    OrderState::Filled
                } else {
                    OrderState::PartiallyFilled
                };
                let signed = i64::from(f.last_qty.get()) * if o.side == Side::Buy { 1 } else { -1 };
                *self.position.entry(o.symbol).or_default() += signed;
            }
            Response::Canceled(_) => o.state = OrderState::Canceled,
            Response::Replaced(r) => {
                o.qty = r.qty.get();
                o.price = r.price.get();
            }
        }
        Ok(resp)
    }

    /// The tracked order `id`.
    pub fn order(&self, id: u64) -> Option<&OwnOrder> {
        self.orders.get(&id)
    }

    /// Every tracked order.
    pub fn orders(&self) -> impl Iterator<Item = (u64, &OwnOrder)> {
        self.orders.iter().map(|(k, v)| (*k, v))
    }

    /// Net position in `symbol` from the fills received.
    pub fn position(&self, symbol: Symbol) -> i64 {
        self.position.get(&symbol).copied().unwrap_or(0)
    }
}

/// Decodes a request (re-exported for engines that log their own traffic).
pub fn decode_request(bytes: &[u8]) -> Result<Request, DecodeError> {
    Request::decode(bytes).map(|(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn tracks_order_life() {
        let mut c = Client::new(100);
        let sym = Symbol::new("AAPL").unwrap();
        let (id, m) = c.new_order(1, sym, Side::Buy, 10, 5);
        assert_eq!(id, 100);
        assert_eq!(decode_request(m.as_bytes()).unwrap().cl_ord_id(), 100);
        c.on_response(Response::ack(id, 7).as_bytes()).unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::New);
        c.on_response(Response::fill(id, 4, 5, 4, 6).as_bytes())
            .unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::PartiallyFilled);
        c.on_response(Response::fill(id, 6, 5, 10, 0).as_bytes())
            .unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::Filled);
        assert_eq!(c.position(sym), 10);
        assert_eq!(
            c.on_response(Response::canceled(id, 0).as_bytes())
                .unwrap_err(),
            ClientError::AlreadyFinal(id)
        );
        assert_eq!(
            c.on_response(Response::ack(999, 1).as_bytes()).unwrap_err(),
            ClientError::UnknownOrder(999)
        );
        let (id2, _) = c.new_order(1, sym, Side::Sell, 10, 5);
        c.on_response(Response::reject(id2, msg_type::NEW_ORDER, RejectReason::Halted).as_bytes())
            .unwrap();
        assert_eq!(
            c.order(id2).unwrap().state,
            OrderState::Rejected(RejectReason::Halted)
        );
    }
}
