//! The order book: every order of the day by gateway order id, the two indexes that find
//! one (the engine's id, the FIX ClOrdID of each request sent for it), and the count of
//! orders not yet final, kept as statuses change.
//!
//! Owns: the orders and their indexes, the open count, which final orders the last
//! checkpoint already left out, and what changed since the last cut (so a cut, on the
//! service thread, never scans the day's orders). It decides nothing about requests or executions (that is the
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
///
/// A checkpoint cut ([`checkpoint_written`](OrderBook::checkpoint_written)) runs on the
/// service thread, so it must cost what changed since the previous cut, never a pass over
/// the day's orders: the book keeps, as orders change, which orders became final
/// (`finished`), which requests each order has (`requests_of`) and which orders have
/// requests but no order yet (`orphans`), so a cut visits only those.
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
    /// The requests of each order id in `by_request` (the reverse index a cut drops an
    /// order's requests by).
    requests_of: FxHashMap<u64, Requests>,
    /// Order ids a request was noted for while the book had no such order (a new order's
    /// request is noted before the order): the next cut drops their requests if there is
    /// still no order.
    orphans: Vec<u64>,
    /// Orders already final at the last checkpoint: the next one leaves them out.
    retired: FxHashSet<u64>,
    /// Orders that became final since the last cut (an id may repeat; some may have
    /// reopened since): the next cut's `retired` is drawn from them.
    finished: Vec<u64>,
    /// Entries the last cut visited (orders, requests, candidates): what it cost, for
    /// tests and the operator.
    last_cut_visits: usize,
}

/// The requests (FIX ClOrdIDs) noted for one order id: one for most orders, so no
/// allocation until a cancel or replace.
#[derive(Clone, Debug)]
enum Requests {
    One(u64),
    Many(Vec<u64>),
}

impl Requests {
    fn push(&mut self, r: u64) {
        match self {
            Requests::One(a) if *a == r => {}
            Requests::One(a) => *self = Requests::Many(vec![*a, r]),
            Requests::Many(v) => {
                if !v.contains(&r) {
                    v.push(r);
                }
            }
        }
    }

    fn as_slice(&self) -> &[u64] {
        match self {
            Requests::One(a) => std::slice::from_ref(a),
            Requests::Many(v) => v,
        }
    }
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
            requests_of: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            orphans: Vec::new(),
            retired: FxHashSet::default(),
            finished: Vec::new(),
            last_cut_visits: 0,
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
    /// final order under the same id is replaced (replay of a journal that reused one): the
    /// replaced order's engine id no longer finds it, as after a restart from a checkpoint,
    /// which holds only the new one.
    pub(super) fn insert_new(&mut self, id: u64, order: Order) {
        let replaced = self.orders.insert(id, order);
        let was_open = replaced.is_some_and(|o| o.status != OrderStatus::Done);
        match (was_open, order.status != OrderStatus::Done) {
            (false, true) => self.open += 1,
            (true, false) => self.open -= 1,
            _ => {}
        }
        if order.status == OrderStatus::Done {
            self.finished.push(id);
        }
        if let Some(old) = replaced {
            let key = (old.engine, old.cl_ord_id);
            if key != (order.engine, order.cl_ord_id) && self.by_engine.get(&key) == Some(&id) {
                self.by_engine.remove(&key);
            }
        }
        self.by_engine.insert((order.engine, order.cl_ord_id), id);
    }

    /// Request `request` (its FIX ClOrdID) was sent for order `id`.
    pub(super) fn note_request(&mut self, request: u64, id: u64) {
        if let Some(before) = self.by_request.insert(request, id) {
            if before != id {
                self.forget_request_of(before, request);
            }
        }
        match self.requests_of.get_mut(&id) {
            Some(rs) => rs.push(request),
            None => {
                self.requests_of.insert(id, Requests::One(request));
            }
        }
        if !self.orders.contains_key(&id) {
            self.orphans.push(id);
        }
    }

    /// `request` now names another order than `id` (a journal that reused a ClOrdID).
    fn forget_request_of(&mut self, id: u64, request: u64) {
        let empty = match self.requests_of.get_mut(&id) {
            Some(Requests::One(a)) => *a == request,
            Some(Requests::Many(v)) => {
                v.retain(|&r| r != request);
                v.is_empty()
            }
            None => false,
        };
        if empty {
            self.requests_of.remove(&id);
        }
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
            (true, false) => {
                self.open -= 1;
                self.finished.push(id);
            }
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

    /// The checkpoint is cut: drops what it leaves out (orders final before the previous
    /// one, and their indexes), and marks today's final orders as left out of the next.
    /// Returns the orders dropped.
    ///
    /// Costs what changed since the previous cut, not the day's orders: the orders final at
    /// the previous cut (`retired`), those that became final since (`finished`) and the ids
    /// noted with no order (`orphans`) are all it visits.
    pub(super) fn checkpoint_written(&mut self) -> Vec<u64> {
        let mut visits = 0;
        let mut dropped = Vec::new();
        for id in std::mem::take(&mut self.retired) {
            visits += 1;
            // Final at the previous cut and still final: left out of the checkpoint.
            if self
                .orders
                .get(&id)
                .is_some_and(|o| o.status == OrderStatus::Done)
            {
                if let Some(o) = self.orders.remove(&id) {
                    let key = (o.engine, o.cl_ord_id);
                    if self.by_engine.get(&key) == Some(&id) {
                        self.by_engine.remove(&key);
                    }
                }
                dropped.push(id);
            }
        }
        let orphans = std::mem::take(&mut self.orphans);
        for &id in dropped.iter().chain(&orphans) {
            visits += 1;
            if self.orders.contains_key(&id) {
                continue;
            }
            if let Some(rs) = self.requests_of.remove(&id) {
                for r in rs.as_slice() {
                    visits += 1;
                    if self.by_request.get(r) == Some(&id) {
                        self.by_request.remove(r);
                    }
                }
            }
        }
        let mut retired = FxHashSet::default();
        for id in std::mem::take(&mut self.finished) {
            visits += 1;
            if self
                .orders
                .get(&id)
                .is_some_and(|o| o.status == OrderStatus::Done)
            {
                retired.insert(id);
            }
        }
        self.retired = retired;
        self.last_cut_visits = visits;
        dropped
    }

    /// Entries the last [`checkpoint_written`](Self::checkpoint_written) visited.
    pub fn last_cut_visits(&self) -> usize {
        self.last_cut_visits
    }

    /// Whether order `id` is in the book.
    #[cfg(test)]
    pub(super) fn contains(&self, id: u64) -> bool {
        self.orders.contains_key(&id)
    }

    /// Empties the book (a checkpoint replaces it).
    pub(super) fn clear(&mut self) {
        self.orders.clear();
        self.by_engine.clear();
        self.by_request.clear();
        self.requests_of.clear();
        self.orphans.clear();
        self.retired.clear();
        self.finished.clear();
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

    /// Everything a restart can observe of a book, in a comparable form.
    type Observed = (
        Vec<(u64, EngineId, u64, u8)>,
        Vec<((EngineId, u64), u64)>,
        Vec<(u64, u64)>,
        Vec<u64>,
        usize,
    );

    fn observe(b: &OrderBook) -> Observed {
        let mut orders: Vec<_> = b
            .iter()
            .map(|(id, o)| (id, o.engine, o.cl_ord_id, o.status as u8))
            .collect();
        orders.sort_unstable();
        let mut by_engine: Vec<_> = b.by_engine.iter().map(|(&k, &v)| (k, v)).collect();
        by_engine.sort_unstable();
        let mut by_request: Vec<_> = b.requests().collect();
        by_request.sort_unstable();
        let mut retired: Vec<_> = b
            .iter()
            .filter(|&(id, _)| !b.keeps(id))
            .map(|(id, _)| id)
            .collect();
        retired.sort_unstable();
        (orders, by_engine, by_request, retired, b.open_count())
    }

    /// What a restart from a checkpoint taken here rebuilds (the checkpoint keeps what
    /// `kept` says, as `Gateway::checkpoint` does, and restores through `restore`).
    fn restarted(b: &OrderBook) -> OrderBook {
        let mut r = OrderBook::new();
        let mut kept: Vec<_> = b.iter().filter(|&(id, o)| b.kept(id, o)).collect();
        kept.sort_unstable_by_key(|(id, _)| *id);
        for (id, o) in kept {
            r.restore(id, *o);
        }
        let mut reqs: Vec<_> = b.requests().filter(|(_, id)| b.keeps(*id)).collect();
        reqs.sort_unstable();
        for (req, id) in reqs {
            r.note_request(req, id);
        }
        r
    }

    #[test]
    fn a_cut_leaves_exactly_what_a_restart_from_its_checkpoint_rebuilds() {
        use rand::{Rng, SeedableRng};
        for seed in 0..50u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut b = OrderBook::new();
            let mut next_id = 1u64;
            let mut next_cl = 1u64;
            for step in 0..400 {
                let known = next_id - 1;
                match rng.gen_range(0..100u32) {
                    0..=29 => {
                        // A new order, its request noted after it (as apply_decision
                        // does) or before.
                        let id = next_id;
                        next_id += 1;
                        let first = rng.gen_bool(0.5);
                        if first {
                            b.note_request(id, id);
                        }
                        b.insert_new(id, order(rng.gen_range(1..4), next_cl));
                        if !first {
                            b.note_request(id, id);
                        }
                        next_cl += 1;
                    }
                    30..=39 if known > 0 => {
                        // A cancel or replace: a request of its own, whether or not the
                        // order is still in the book.
                        let id = rng.gen_range(1..=known);
                        b.note_request(next_id, id);
                        next_id += 1;
                    }
                    40..=79 if known > 0 => {
                        let id = rng.gen_range(1..=known);
                        let status = match rng.gen_range(0..10u32) {
                            0..=6 => OrderStatus::Done,
                            7..=8 => OrderStatus::Open,
                            _ => OrderStatus::PendingNew,
                        };
                        b.set_status(id, status);
                    }
                    80..=81 if known > 0 => {
                        // A journal that reused an order id.
                        let id = rng.gen_range(1..=known);
                        let mut o = order(1, next_cl);
                        next_cl += 1;
                        if rng.gen_bool(0.3) {
                            o.status = OrderStatus::Done;
                        }
                        b.insert_new(id, o);
                    }
                    82..=83 => {
                        // A request noted for an order that never comes.
                        b.note_request(next_id, next_id + 1_000_000);
                        next_id += 1;
                    }
                    84..=91 => {
                        let want = observe(&restarted(&b));
                        b.checkpoint_written();
                        assert_eq!(observe(&b), want, "seed {seed} step {step}");
                        assert_eq!(b.open_count(), b.open_scan());
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_cut_visits_what_changed_since_the_previous_one_not_the_book() {
        let mut b = OrderBook::new();
        for id in 1..=20_000u64 {
            b.note_request(id, id);
            b.insert_new(id, order(1, id));
            if id % 2 == 0 {
                b.set_status(id, OrderStatus::Done);
            }
        }
        b.checkpoint_written();
        b.checkpoint_written();
        assert_eq!(
            b.iter().count(),
            10_000,
            "the final half is gone after two cuts"
        );
        // A quiet segment: 3 changes.
        b.set_status(1, OrderStatus::Done);
        b.note_request(30_001, 3);
        b.insert_new(30_002, order(2, 30_002));
        b.checkpoint_written();
        assert!(
            b.last_cut_visits() <= 10,
            "a cut after 3 changes visited {} entries of a 10,000-order book",
            b.last_cut_visits()
        );
        b.checkpoint_written();
        assert!(!b.contains(1) && b.order_of_request(1).is_none());
        assert!(b.last_cut_visits() <= 10, "visited {}", b.last_cut_visits());
    }
}
