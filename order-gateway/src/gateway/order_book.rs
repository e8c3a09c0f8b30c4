//! The order book: every order of the day by gateway order id, the two indexes that find
//! one (the engine's id, the FIX ClOrdID of each request sent for it), and the count of
//! orders not yet final, kept as statuses change.
//!
//! Owns: the orders and their indexes, the open count, which final orders the last
//! checkpoint already left out (by the cut each became final at), and the orders a cut
//! left out that still take memory (swept a bounded number at a time, so a cut on the
//! service thread never visits the day's orders, nor the orders it drops). It decides nothing about requests or executions (that is the
//! gateway's, through risk and the FIX session), sends nothing, reads no clock: it is plain
//! state the gateway moves with [`OrderBook::insert_new`], [`OrderBook::set_status`] and
//! [`OrderBook::note_request`], the same calls live and in replay. A status change goes
//! through [`OrderBook::set_status`] only, so the open count cannot drift from the orders.

use std::collections::VecDeque;

/// The book's maps: they grow with the day, so a resize moves a few entries per insert
/// (griddle's incremental resizing) instead of all of them in one turn (a 1M-order day
/// stalled a turn 84 ms with `FxHashMap`).
type Map<K, V> = griddle::HashMap<K, V, rustc_hash::FxBuildHasher>;

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
    /// The book's cut count when the order last became final (set by the book; meaningless
    /// while the order is not final).
    pub(super) final_cut: u32,
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
/// service thread, so it must not cost the orders it drops, let alone the day's: a cut
/// only counts itself (`cuts`) and drops the requests noted for no order (`orphans`). An
/// order is *dead* (what a checkpoint left out) when it is final and became so two cuts
/// ago or earlier ([`OrderBook::is_dead`]); every accessor treats a dead order, its engine
/// id and its requests as absent, exactly as after a restart from that checkpoint, which
/// does not hold them. Their memory is freed later, by [`OrderBook::sweep`] in bounded
/// steps, from the orders that became final at each cut (`finals`).
#[derive(Debug)]
pub struct OrderBook {
    orders: Map<u64, Order>,
    /// Orders in `orders` whose status is not Done, kept as they change: the service reads
    /// it every millisecond, and `orders` keeps every order of the day.
    open: usize,
    /// (engine, engine's id) to order id.
    by_engine: Map<(EngineId, u64), u64>,
    /// FIX ClOrdID of each request sent (new, cancel, replace) to order id.
    by_request: Map<u64, u64>,
    /// The requests of each order id in `by_request` (the reverse index a cut drops an
    /// order's requests by).
    requests_of: Map<u64, Requests>,
    /// Order ids a request was noted for while the book had no such order (a new order's
    /// request is noted before the order): the next cut drops their requests if there is
    /// still no order.
    orphans: Vec<u64>,
    /// Cuts applied since the book was made or restored (starts at 1, so a restored final
    /// order can be one cut old).
    cuts: u32,
    /// The orders that became final, by the cut count they became final at, oldest first
    /// (an id may repeat; some may have reopened since): what [`sweep`](Self::sweep) frees
    /// once they are dead.
    finals: VecDeque<(u32, Vec<u64>)>,
    /// Ids in `finals`.
    finals_len: usize,
    /// Orders that became final since the previous [`sweep`](Self::sweep): added to its
    /// budget, so the sweep keeps pace with however many a turn makes final.
    finals_owed: usize,
    /// Entries the last cut visited (orphans and their requests): what it cost, for tests
    /// and the operator.
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
            orders: Map::with_capacity_and_hasher(1 << 16, Default::default()),
            open: 0,
            by_engine: Map::with_capacity_and_hasher(1 << 16, Default::default()),
            by_request: Map::with_capacity_and_hasher(1 << 16, Default::default()),
            requests_of: Map::with_capacity_and_hasher(1 << 16, Default::default()),
            orphans: Vec::new(),
            cuts: 1,
            finals: VecDeque::new(),
            finals_len: 0,
            finals_owed: 0,
            last_cut_visits: 0,
        }
    }

    /// Whether `o` is dead: left out by a checkpoint already cut (final since two cuts or
    /// more), so absent to every accessor though its memory is not swept yet.
    fn is_dead(&self, o: &Order) -> bool {
        o.status == OrderStatus::Done && o.final_cut.saturating_add(2) <= self.cuts
    }

    /// Whether a request noted for order `id` is visible: no dead order under `id` (a
    /// request for no order is an orphan, visible until the next cut drops it).
    fn request_visible(&self, id: u64) -> bool {
        self.orders.get(&id).is_none_or(|o| !self.is_dead(o))
    }

    /// Order `id`.
    pub fn get(&self, id: u64) -> Option<&Order> {
        self.orders.get(&id).filter(|o| !self.is_dead(o))
    }

    /// Order `id`, to change anything but its status ([`set_status`](Self::set_status)).
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Order> {
        let cuts = self.cuts;
        self.orders
            .get_mut(&id)
            .filter(|o| !(o.status == OrderStatus::Done && o.final_cut.saturating_add(2) <= cuts))
    }

    /// The order id of `engine`'s order `cl_ord_id`.
    pub fn id_of(&self, engine: EngineId, cl_ord_id: u64) -> Option<u64> {
        let id = *self.by_engine.get(&(engine, cl_ord_id))?;
        self.get(id).map(|_| id)
    }

    /// Order of `engine` with the engine's id `cl_ord_id`.
    pub fn by_engine(&self, engine: EngineId, cl_ord_id: u64) -> Option<&Order> {
        self.get(*self.by_engine.get(&(engine, cl_ord_id))?)
    }

    /// The order a request (by its FIX ClOrdID) was sent for.
    pub fn order_of_request(&self, request: u64) -> Option<u64> {
        let id = *self.by_request.get(&request)?;
        self.request_visible(id).then_some(id)
    }

    /// Every order, keyed by gateway order id.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Order)> {
        self.orders
            .iter()
            .filter(|(_, o)| !self.is_dead(o))
            .map(|(k, v)| (*k, v))
    }

    /// Every request sent, as (FIX ClOrdID, order id).
    pub fn requests(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_request
            .iter()
            .filter(|&(_, &id)| self.request_visible(id))
            .map(|(&r, &id)| (r, id))
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
        self.iter().fold((0, 0), |(n, c), (_, o)| {
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
    pub(super) fn insert_new(&mut self, id: u64, mut order: Order) {
        // A dead order under the same id is absent already: gone with its indexes first.
        self.purge_dead(id);
        order.final_cut = self.cuts;
        let replaced = self.orders.insert(id, order);
        let was_open = replaced.is_some_and(|o| o.status != OrderStatus::Done);
        match (was_open, order.status != OrderStatus::Done) {
            (false, true) => self.open += 1,
            (true, false) => self.open -= 1,
            _ => {}
        }
        if order.status == OrderStatus::Done {
            self.note_final(self.cuts, id);
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
        // A dead order under `id` is absent: the request is an orphan, as after a restart.
        // One lookup in the common case (a live order, or none yet).
        let orphan = match self.orders.get(&id) {
            Some(o) if self.is_dead(o) => {
                self.purge_dead(id);
                true
            }
            Some(_) => false,
            None => true,
        };
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
        if orphan {
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
        let cuts = self.cuts;
        let Some(o) = self.get_mut(id) else {
            return false;
        };
        let was_open = o.status != OrderStatus::Done;
        let now_open = status != OrderStatus::Done;
        o.status = status;
        match (was_open, now_open) {
            (true, false) => {
                o.final_cut = cuts;
                self.open -= 1;
                self.note_final(cuts, id);
            }
            (false, true) => self.open += 1,
            _ => {}
        }
        true
    }

    /// Whether a checkpoint keeps order `id`: live orders, and orders that became final
    /// since the previous checkpoint (final at the last cut or earlier: left out).
    pub(super) fn kept(&self, o: &Order) -> bool {
        o.status != OrderStatus::Done || o.final_cut.saturating_add(1) > self.cuts
    }

    /// Whether a checkpoint keeps order `id` (see [`kept`](Self::kept)); false if unknown.
    pub(super) fn keeps(&self, id: u64) -> bool {
        self.get(id).is_some_and(|o| self.kept(o))
    }

    /// The checkpoint is cut: what it leaves out (orders final before the previous one, and
    /// their indexes) is dead from now on, and today's final orders are marked as left out
    /// of the next.
    ///
    /// Costs the requests noted for no order since the previous cut (`orphans`: dropped if
    /// there is still none), never the orders it drops: those are only counted dead here
    /// ([`is_dead`](Self::is_dead)), and freed by [`sweep`](Self::sweep).
    pub(super) fn checkpoint_written(&mut self) {
        self.cuts += 1;
        let mut visits = 0;
        let orphans = std::mem::take(&mut self.orphans);
        for &id in &orphans {
            visits += 1;
            if self.orders.contains_key(&id) {
                continue;
            }
            visits += self.drop_requests_of(id);
        }
        self.last_cut_visits = visits;
    }

    /// Frees the memory of up to `budget` orders the cuts left out (dead), oldest first,
    /// plus as many as became final since the previous sweep; returns the entries visited.
    /// Changes nothing any accessor shows: dead orders are absent already. The service
    /// calls it after each turn's output has left, so a turn frees a constant number more
    /// than it made final and the dead orders waiting (those of cuts already written) drain
    /// however fast engines finish orders; replay frees everything at each cut.
    pub(super) fn sweep(&mut self, budget: usize) -> usize {
        let budget = budget.saturating_add(std::mem::take(&mut self.finals_owed));
        let mut visits = 0;
        while visits < budget {
            let Some((cut, ids)) = self.finals.front_mut() else {
                break;
            };
            if cut.saturating_add(2) > self.cuts {
                break;
            }
            let Some(id) = ids.pop() else {
                self.finals.pop_front();
                continue;
            };
            self.finals_len -= 1;
            visits += 1;
            self.purge_dead(id);
        }
        visits
    }

    /// Orders (ids, some repeated) that became final and are not swept yet.
    pub fn unswept(&self) -> usize {
        self.finals_len
    }

    /// Order `id` became final at cut `cut`: for [`sweep`](Self::sweep).
    fn note_final(&mut self, cut: u32, id: u64) {
        match self.finals.back_mut() {
            Some((c, ids)) if *c == cut => ids.push(id),
            _ => self.finals.push_back((cut, vec![id])),
        }
        self.finals_len += 1;
        self.finals_owed += 1;
    }

    /// Removes order `id` and its indexes if it is dead (absent to every accessor already).
    fn purge_dead(&mut self, id: u64) {
        if !self.orders.get(&id).is_some_and(|o| self.is_dead(o)) {
            return;
        }
        if let Some(o) = self.orders.remove(&id) {
            let key = (o.engine, o.cl_ord_id);
            if self.by_engine.get(&key) == Some(&id) {
                self.by_engine.remove(&key);
            }
        }
        self.drop_requests_of(id);
    }

    /// Removes the requests noted for `id`; returns how many.
    fn drop_requests_of(&mut self, id: u64) -> usize {
        let Some(rs) = self.requests_of.remove(&id) else {
            return 0;
        };
        for r in rs.as_slice() {
            if self.by_request.get(r) == Some(&id) {
                self.by_request.remove(r);
            }
        }
        rs.as_slice().len()
    }

    /// Entries the last [`checkpoint_written`](Self::checkpoint_written) visited.
    pub fn last_cut_visits(&self) -> usize {
        self.last_cut_visits
    }

    /// Whether order `id` is in the book.
    #[cfg(test)]
    pub(super) fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Orders held in memory, dead ones not swept yet included.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.orders.len()
    }

    /// Empties the book (a checkpoint replaces it).
    pub(super) fn clear(&mut self) {
        self.orders.clear();
        self.by_engine.clear();
        self.by_request.clear();
        self.requests_of.clear();
        self.orphans.clear();
        self.cuts = 1;
        self.finals.clear();
        self.finals_len = 0;
        self.finals_owed = 0;
        self.open = 0;
    }

    /// An order as a checkpoint holds it: final ones count as already left out once.
    pub(super) fn restore(&mut self, id: u64, mut order: Order) {
        if order.status == OrderStatus::Done {
            order.final_cut = self.cuts - 1;
            self.note_final(self.cuts - 1, id);
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
            final_cut: 0,
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
        // Entries of dead orders not swept yet find nothing: not observable.
        let mut by_engine: Vec<_> = b
            .by_engine
            .iter()
            .filter(|&(&k, &v)| b.by_engine(k.0, k.1).is_some() && b.id_of(k.0, k.1) == Some(v))
            .map(|(&k, &v)| (k, v))
            .collect();
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
        let mut kept: Vec<_> = b.iter().filter(|&(_, o)| b.kept(o)).collect();
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
                    92..=95 => {
                        // Sweeping frees memory and changes nothing observable.
                        let before = observe(&b);
                        let restart = observe(&restarted(&b));
                        b.sweep(rng.gen_range(0..40));
                        assert_eq!(observe(&b), before, "seed {seed} step {step}: sweep");
                        assert_eq!(observe(&restarted(&b)), restart, "seed {seed} step {step}");
                    }
                    _ => {}
                }
            }
            let before = observe(&b);
            b.sweep(usize::MAX);
            assert_eq!(observe(&b), before, "seed {seed}: the last sweep");
            assert_eq!(
                b.held(),
                b.iter().count(),
                "seed {seed}: a dead order left in memory"
            );
            let live: std::collections::HashSet<u64> = b.iter().map(|(id, _)| id).collect();
            assert!(
                b.by_engine.values().all(|id| live.contains(id)),
                "seed {seed}: an engine id of a swept order left"
            );
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
        assert_eq!(b.sweep(0), 0, "nothing is dead before a cut");
        b.checkpoint_written();
        b.checkpoint_written();
        assert_eq!(
            b.iter().count(),
            10_000,
            "the final half is gone after two cuts"
        );
        assert!(
            b.last_cut_visits() <= 10,
            "the cut that dropped 10,000 orders visited {} entries",
            b.last_cut_visits()
        );
        assert_eq!(b.held(), 20_000, "dropped, not freed yet");
        assert!(!b.contains(2) && b.id_of(1, 2).is_none() && b.order_of_request(2).is_none());
        // Freed a bounded number at a time.
        assert_eq!(b.sweep(4_000), 4_000);
        assert_eq!(b.held(), 16_000);
        while b.sweep(4_000) > 0 {}
        assert_eq!((b.held(), b.unswept()), (10_000, 0));
        assert_eq!(b.by_request.len(), 10_000);
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

    /// Engines that finish more orders per turn than the constant part of the sweep (a
    /// hostile or just busy one, for hours): the orders waiting to be freed stay within
    /// what the last cuts left out, instead of growing by the difference every turn.
    #[test]
    fn the_sweep_keeps_pace_with_orders_finished_faster_than_its_constant_budget() {
        const PER_TURN: u64 = 100;
        const TURNS_PER_CUT: u64 = 50;
        const BASE: usize = 32;
        let mut b = OrderBook::new();
        let mut id = 0u64;
        let mut most = 0;
        for turn in 1..=2_000u64 {
            for _ in 0..PER_TURN {
                id += 1;
                b.note_request(id, id);
                b.insert_new(id, order(1, id));
                b.set_status(id, OrderStatus::Done);
            }
            if turn % TURNS_PER_CUT == 0 {
                b.checkpoint_written();
            }
            b.sweep(BASE);
            most = most.max(b.unswept());
        }
        // Final and not dead yet: at most the orders of the last two cut windows, plus
        // the turn's own; with a constant budget of 32 this grew to 139,168.
        let window = (PER_TURN * TURNS_PER_CUT) as usize;
        assert!(
            most <= 3 * window,
            "{most} orders waiting to be freed, more than three cut windows ({window} each)"
        );
        assert!(
            b.held() <= 3 * window + PER_TURN as usize,
            "held {}",
            b.held()
        );
    }
}
