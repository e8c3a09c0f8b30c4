//! The order book: every order of the day by gateway order id, the two indexes that find
//! one (the engine's id, the FIX ClOrdID of each request sent for it), and the count of
//! orders not yet final, kept as statuses change.
//!
//! Owns: the orders and their indexes, the open count, and which final orders the last
//! checkpoint already left out. It decides nothing about requests or executions (that is the
//! gateway's, through risk and the FIX session), sends nothing, reads no clock: it is plain
//! state the gateway moves with [`OrderBook::insert_new`], [`OrderBook::set_status`] and
//! [`OrderBook::note_request`], the same calls live and in replay. A status change goes
//! through [`OrderBook::set_status`] only, so the open count cannot drift from the orders.

use rustc_hash::{FxHashMap, FxHashSet};

use super::EngineId;
use crate::risk::OrderParams;

/// Where an order is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderStatus {
    /// Sent to the venue, not acknowledged.
    PendingNew,
    /// Live at the venue.
    Open,
    /// Filled, canceled or rejected.
    Done,
}

/// A change of an order in flight at the venue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    Cancel,
    Replace { qty: u32, price: i64 },
}

/// A gateway order.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    /// Owning engine.
    pub engine: EngineId,
    /// The engine's id.
    pub cl_ord_id: u64,
    /// Current terms.
    pub params: OrderParams,
    /// Executed quantity.
    pub cum_qty: u32,
    /// Status (to or from Done through `OrderBook::set_status` only, which keeps the
    /// open count).
    pub status: OrderStatus,
    /// FIX ClOrdID the venue currently knows the order by.
    pub venue_cl_ord_id: u64,
    /// Sum of quantity x price (in [`crate::proto::PRICE_SCALE`] units) of the executions
    /// applied: with the venue's AvgPx it prices executions only a status answer reports.
    pub notional: i128,
    /// The cancel or replace in flight: its request id and what it changes.
    pub(super) pending: Option<(u64, Change)>,
}

impl Order {
    /// A cancel or replace of this order is in flight (unanswered by the venue).
    pub fn has_pending_change(&self) -> bool {
        self.pending.is_some()
    }
}

/// The orders of the day and their indexes.
#[derive(Debug)]
pub struct OrderBook {
    orders: FxHashMap<u64, Order>,
    /// Orders in `orders` whose status is not Done, kept as they change: the service reads
    /// it every millisecond, and `orders` keeps every order of the day.
    open: usize,
    /// (engine, engine's id) to order id.
    by_engine: FxHashMap<(EngineId, u64), u64>,
    /// FIX ClOrdID of each request sent (new, cancel, replace) to order id.
    by_request: FxHashMap<u64, u64>,
    /// Orders already final at the last checkpoint: the next one leaves them out.
    retired: FxHashSet<u64>,
}

impl Default for OrderBook {
    fn default() -> OrderBook {
        OrderBook::new()
    }
}

impl OrderBook {
    /// An empty book, sized for a busy day.
    pub fn new() -> OrderBook {
        OrderBook {
            orders: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            open: 0,
            by_engine: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            by_request: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            retired: FxHashSet::default(),
        }
    }

    /// Order `id`.
    pub fn get(&self, id: u64) -> Option<&Order> {
        self.orders.get(&id)
    }

    /// Order `id`, to change anything but its status ([`set_status`](Self::set_status)).
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Order> {
        self.orders.get_mut(&id)
    }

    /// The order id of `engine`'s order `cl_ord_id`.
    pub fn id_of(&self, engine: EngineId, cl_ord_id: u64) -> Option<u64> {
        self.by_engine.get(&(engine, cl_ord_id)).copied()
    }

    /// Order of `engine` with the engine's id `cl_ord_id`.
    pub fn by_engine(&self, engine: EngineId, cl_ord_id: u64) -> Option<&Order> {
        self.id_of(engine, cl_ord_id)
            .and_then(|id| self.orders.get(&id))
    }

    /// The order a request (by its FIX ClOrdID) was sent for.
    pub fn order_of_request(&self, request: u64) -> Option<u64> {
        self.by_request.get(&request).copied()
    }

    /// Every order, keyed by gateway order id.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Order)> {
        self.orders.iter().map(|(k, v)| (*k, v))
    }

    /// Every request sent, as (FIX ClOrdID, order id).
    pub fn requests(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_request.iter().map(|(&r, &id)| (r, id))
    }

    /// Orders not yet final.
    pub fn open_count(&self) -> usize {
        self.open
    }

    /// [`open_count`](Self::open_count) counted the slow way, to check the kept count.
    #[cfg(test)]
    pub(super) fn open_scan(&self) -> usize {
        self.orders
            .values()
            .filter(|o| o.status != OrderStatus::Done)
            .count()
    }

    /// Requests sent and not yet answered by the venue: new orders not acknowledged, and
    /// cancels or replaces pending (a scan of the day's orders: for the operator's status).
    pub fn unacknowledged(&self) -> (usize, usize) {
        self.orders.values().fold((0, 0), |(n, c), o| {
            (
                n + usize::from(o.status == OrderStatus::PendingNew),
                c + usize::from(o.pending.is_some()),
            )
        })
    }

    /// A new order `id` (status [`OrderStatus::PendingNew`]), indexed by its engine's id. A
    /// final order under the same id is replaced (replay of a journal that reused one).
    pub(super) fn insert_new(&mut self, id: u64, order: Order) {
        let replaced = self.orders.insert(id, order);
        if order.status != OrderStatus::Done
            && replaced.is_none_or(|o| o.status == OrderStatus::Done)
        {
            self.open += 1;
        }
        self.by_engine.insert((order.engine, order.cl_ord_id), id);
    }

    /// Request `request` (its FIX ClOrdID) was sent for order `id`.
    pub(super) fn note_request(&mut self, request: u64, id: u64) {
        self.by_request.insert(request, id);
    }

    /// Moves order `id` to `status`, keeping the open count; false if there is no such
    /// order.
    pub(super) fn set_status(&mut self, id: u64, status: OrderStatus) -> bool {
        let Some(o) = self.orders.get_mut(&id) else {
            return false;
        };
        let was_open = o.status != OrderStatus::Done;
        let now_open = status != OrderStatus::Done;
        o.status = status;
        match (was_open, now_open) {
            (true, false) => self.open -= 1,
            (false, true) => self.open += 1,
            _ => {}
        }
        true
    }

    /// Whether a checkpoint keeps order `id`: live orders, and orders that became final
    /// since the previous checkpoint.
    pub(super) fn kept(&self, id: u64, o: &Order) -> bool {
        o.status != OrderStatus::Done || !self.retired.contains(&id)
    }

    /// Whether a checkpoint keeps order `id` (see [`kept`](Self::kept)); false if unknown.
    pub(super) fn keeps(&self, id: u64) -> bool {
        self.orders.get(&id).is_some_and(|o| self.kept(id, o))
    }

    /// The checkpoint is durable: drops what it left out (orders final before the previous
    /// one, and their indexes), and marks today's final orders as left out of the next.
    pub(super) fn checkpoint_written(&mut self) {
        let drop: Vec<u64> = self
            .orders
            .iter()
            .filter(|&(&id, o)| !self.kept(id, o))
            .map(|(&id, _)| id)
            .collect();
        for id in &drop {
            if let Some(o) = self.orders.remove(id) {
                self.by_engine.remove(&(o.engine, o.cl_ord_id));
            }
        }
        let orders = &self.orders;
        self.by_request.retain(|_, id| orders.contains_key(id));
        self.by_engine.retain(|_, id| orders.contains_key(id));
        self.retired = self
            .orders
            .iter()
            .filter(|(_, o)| o.status == OrderStatus::Done)
            .map(|(&id, _)| id)
            .collect();
    }

    /// Whether order `id` is in the book.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.orders.contains_key(&id)
    }

    /// Empties the book (a checkpoint replaces it).
    pub(super) fn clear(&mut self) {
        self.orders.clear();
        self.by_engine.clear();
        self.by_request.clear();
        self.retired.clear();
        self.open = 0;
    }

    /// An order as a checkpoint holds it: final ones count as already left out once.
    pub(super) fn restore(&mut self, id: u64, order: Order) {
        if order.status == OrderStatus::Done {
            self.retired.insert(id);
        } else {
            self.open += 1;
        }
        self.by_engine.insert((order.engine, order.cl_ord_id), id);
        self.orders.insert(id, order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Side, Symbol};

    fn order(engine: EngineId, cl: u64) -> Order {
        Order {
            engine,
            cl_ord_id: cl,
            params: OrderParams {
                account: 1,
                symbol: Symbol::new("AAPL").expect("symbol"),
                side: Side::Buy,
                qty: 100,
                price: 1_000_000,
            },
            cum_qty: 0,
            status: OrderStatus::PendingNew,
            venue_cl_ord_id: cl,
            notional: 0,
            pending: None,
        }
    }

    #[test]
    fn the_open_count_follows_every_status_change() {
        let mut b = OrderBook::new();
        b.insert_new(1, order(7, 11));
        b.insert_new(2, order(7, 12));
        assert_eq!(b.open_count(), 2);
        assert!(b.set_status(1, OrderStatus::Open));
        assert_eq!(b.open_count(), 2);
        assert!(b.set_status(1, OrderStatus::Done));
        assert_eq!(b.open_count(), 1);
        // Final twice (a late answer): counted once.
        assert!(b.set_status(1, OrderStatus::Done));
        assert_eq!(b.open_count(), 1);
        // A trade cancel reopens a filled order.
        assert!(b.set_status(1, OrderStatus::Open));
        assert_eq!(b.open_count(), 2);
        assert!(!b.set_status(99, OrderStatus::Done));
        assert_eq!(b.open_count(), b.open_scan());
    }

    #[test]
    fn indexes_find_an_order_by_engine_id_and_by_each_request() {
        let mut b = OrderBook::new();
        b.insert_new(5, order(3, 40));
        b.note_request(5, 5);
        b.note_request(6, 5); // a cancel's own ClOrdID
        assert_eq!(b.id_of(3, 40), Some(5));
        assert_eq!(b.by_engine(3, 40).map(|o| o.cl_ord_id), Some(40));
        assert_eq!(b.id_of(4, 40), None);
        assert_eq!(b.order_of_request(6), Some(5));
        assert_eq!(b.order_of_request(7), None);
    }

    #[test]
    fn a_checkpoint_leaves_out_orders_final_before_the_previous_one() {
        let mut b = OrderBook::new();
        b.insert_new(1, order(1, 1));
        b.note_request(1, 1);
        b.insert_new(2, order(1, 2));
        b.note_request(2, 2);
        b.set_status(1, OrderStatus::Done);
        // Final since the last checkpoint: the next one keeps it.
        assert!(b.keeps(1) && b.keeps(2));
        b.checkpoint_written();
        assert!(b.contains(1), "kept until a checkpoint has left it out");
        assert!(!b.keeps(1) && b.keeps(2));
        b.checkpoint_written();
        assert!(!b.contains(1) && b.id_of(1, 1).is_none() && b.order_of_request(1).is_none());
        assert_eq!(b.open_count(), 1);
        assert_eq!(b.open_count(), b.open_scan());
    }

    #[test]
    fn restored_orders_count_open_and_final_as_the_checkpoint_says() {
        let mut b = OrderBook::new();
        let mut done = order(1, 1);
        done.status = OrderStatus::Done;
        b.restore(1, done);
        b.restore(2, order(1, 2));
        assert_eq!(b.open_count(), 1);
        assert!(!b.keeps(1), "final at the checkpoint: left out of the next");
        b.clear();
        assert_eq!((b.open_count(), b.iter().count()), (0, 0));
    }
}
