//! Resting orders by ITCH order reference number.
//!
//! NASDAQ hands out order references in increasing order from the start of the day and never
//! reuses one, so the live references of a day are a dense-ish window of small integers. A
//! hash map pays for hashing, probing and (as it grows) rehashing on every add, execute,
//! cancel, delete and replace; here a reference below [`DIRECT_LIMIT`] is an index into
//! pages of [`PAGE`] slots instead: one shift to find the page, one load to find the order.
//! A page is allocated when its first order arrives and given back (kept as a spare, up to
//! [`SPARES`]) when its last order leaves, so memory follows the live orders, not the
//! day's count of references. References at or above the limit, which a well-formed feed
//! never sends but bad input may, go to a hash map, so no reference can make the page table
//! grow past `DIRECT_LIMIT / PAGE` entries.
//!
//! An empty slot is an order of zero shares: the book never keeps one (zero-share adds are
//! refused, an order reduced to zero is removed).

use super::{Order, Side};
use rustc_hash::FxHashMap;

/// Slots per page (4,096 orders of 12 bytes: 48 KiB).
const PAGE_BITS: u32 = 12;
const PAGE: usize = 1 << PAGE_BITS;
/// References below this are indexed directly; the page table then has at most 2^18 entries
/// (2 MiB). A NASDAQ day adds some 10^8 orders.
pub(super) const DIRECT_LIMIT: u64 = 1 << 30;
/// Freed pages kept for reuse, so a page boundary crossed back and forth does not allocate.
const SPARES: usize = 4;

const EMPTY: Order = Order {
    locate: 0,
    side: Side::Bid,
    price: 0,
    shares: 0,
};

type Page = Box<[Order; PAGE]>;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub(super) struct Orders {
    pages: Vec<Option<Page>>,
    /// Live orders per page, to know when one can be given back.
    live: Vec<u32>,
    spare: Vec<Page>,
    far: FxHashMap<u64, Order>,
    len: usize,
}

fn split(reference: u64) -> Option<(usize, usize)> {
    (reference < DIRECT_LIMIT).then_some((
        (reference >> PAGE_BITS) as usize,
        (reference as usize) & (PAGE - 1),
    ))
}

impl Orders {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, reference: u64) -> Option<&Order> {
        match split(reference) {
            Some((p, i)) => self
                .pages
                .get(p)?
                .as_ref()
                .map(|page| &page[i])
                .filter(|o| o.shares != 0),
            None => self.far.get(&reference),
        }
    }

    pub(super) fn get_mut(&mut self, reference: u64) -> Option<&mut Order> {
        match split(reference) {
            Some((p, i)) => self
                .pages
                .get_mut(p)?
                .as_mut()
                .map(|page| &mut page[i])
                .filter(|o| o.shares != 0),
            None => self.far.get_mut(&reference),
        }
    }

    pub(super) fn contains(&self, reference: u64) -> bool {
        self.get(reference).is_some()
    }

    /// Stores `order` (`shares > 0`) under a reference that is not live.
    pub(super) fn insert_new(&mut self, reference: u64, order: Order) {
        debug_assert!(order.shares != 0 && !self.contains(reference));
        self.len += 1;
        let Some((p, i)) = split(reference) else {
            self.far.insert(reference, order);
            return;
        };
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, || None);
            self.live.resize(p + 1, 0);
        }
        let spare = &mut self.spare;
        let page = self.pages[p]
            .get_or_insert_with(|| spare.pop().unwrap_or_else(|| Box::new([EMPTY; PAGE])));
        page[i] = order;
        self.live[p] += 1;
    }

    /// Takes the order out, if it is live.
    pub(super) fn remove(&mut self, reference: u64) -> Option<Order> {
        let Some((p, i)) = split(reference) else {
            let o = self.far.remove(&reference);
            self.len -= usize::from(o.is_some());
            return o;
        };
        let slot = self.pages.get_mut(p)?.as_mut()?;
        let o = std::mem::replace(&mut slot[i], EMPTY);
        if o.shares == 0 {
            return None;
        }
        self.len -= 1;
        self.live[p] -= 1;
        if self.live[p] == 0 {
            if let Some(page) = self.pages[p].take() {
                if self.spare.len() < SPARES {
                    // Every slot is EMPTY again: the last order just left.
                    self.spare.push(page);
                }
            }
        }
        Some(o)
    }

    /// Every live order, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Order)> + '_ {
        let direct = self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().flat_map(move |page| {
                page.iter()
                    .enumerate()
                    .filter(|(_, o)| o.shares != 0)
                    .map(move |(i, o)| (((p as u64) << PAGE_BITS) | i as u64, o))
            })
        });
        direct.chain(self.far.iter().map(|(&r, o)| (r, o)))
    }

    /// Room for `n` orders above the direct range (the direct pages need no reserving).
    pub(super) fn reserve_far(&mut self, n: usize) {
        self.far.reserve(n);
    }
}

impl PartialEq for Orders {
    /// The same live orders under the same references.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(r, o)| other.get(r) == Some(o))
    }
}
impl Eq for Orders {}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(shares: u32) -> Order {
        Order {
            locate: 3,
            side: Side::Ask,
            price: 1_000_000,
            shares,
        }
    }

    #[test]
    fn direct_and_far_references_behave_alike() {
        let mut m = Orders::default();
        let refs = [
            0,
            1,
            PAGE as u64 - 1,
            PAGE as u64,
            5 * PAGE as u64 + 7,
            DIRECT_LIMIT - 1,
            DIRECT_LIMIT,
            u64::MAX,
        ];
        for (k, &r) in refs.iter().enumerate() {
            assert!(!m.contains(r));
            m.insert_new(r, order(k as u32 + 1));
        }
        assert_eq!(m.len(), refs.len());
        for (k, &r) in refs.iter().enumerate() {
            assert_eq!(m.get(r), Some(&order(k as u32 + 1)), "{r}");
            m.get_mut(r).unwrap().shares += 100;
        }
        let mut seen: Vec<u64> = m.iter().map(|(r, _)| r).collect();
        seen.sort_unstable();
        assert_eq!(seen, refs);
        assert!(
            m.get(2).is_none() && m.remove(2).is_none() && m.remove(DIRECT_LIMIT + 1).is_none()
        );
        for (k, &r) in refs.iter().enumerate() {
            assert_eq!(m.remove(r), Some(order(k as u32 + 101)));
            assert_eq!(m.remove(r), None);
        }
        assert_eq!(m.len(), 0);
        assert_eq!(m.iter().count(), 0);
        // Every page was given back; some are kept as spares, clean for reuse.
        assert!(m.pages.iter().all(Option::is_none));
        assert!(!m.spare.is_empty() && m.spare.len() <= SPARES);
        m.insert_new(PAGE as u64 + 1, order(9));
        assert_eq!(m.iter().count(), 1);
    }

    #[test]
    fn equality_ignores_layout() {
        let mut a = Orders::default();
        let mut b = Orders::default();
        a.insert_new(10, order(1));
        a.insert_new(1 << 40, order(2));
        b.insert_new(1 << 40, order(2));
        assert_ne!(a, b);
        b.insert_new(10, order(1));
        assert_eq!(a, b);
        b.get_mut(10).unwrap().shares = 5;
        assert_ne!(a, b);
    }
}
