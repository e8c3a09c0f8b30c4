//! Resting orders by ITCH order reference number.
//!
//! NASDAQ hands out order references in increasing order from the start of the day and never
//! reuses one, so the live references of a day are a dense-ish window of small integers. A
//! hash map pays for hashing, probing and (as it grows) rehashing on every add, execute,
//! cancel, delete and replace; here a reference below [`DIRECT_LIMIT`] is an index into
//! pages of [`PAGE`] slots instead: one shift to find the page, one load to find the order.
//! A page is allocated when its first order arrives and given back (kept as a spare, up to
//! [`SPARES`]) when its last order leaves, so memory follows the live orders, not the
//! day's count of references.
//!
//! Two limits keep bad or unusual input from costing more memory than a hash map would by
//! much. References at or above [`DIRECT_LIMIT`], which a well-formed feed never sends, go
//! to a hash map (`overflow`), so no reference can make the page table grow past
//! `DIRECT_LIMIT / PAGE` entries. And the pages in use are limited to [`FREE_PAGES`] plus one
//! per [`MIN_ORDERS_PER_PAGE`] live orders: an order whose page does not exist when that
//! budget is spent goes to the hash map too, so references scattered one per page (or a day
//! whose old orders keep many pages barely used) cost at most about 48 bytes of pages per
//! live order beyond 3 MiB, not 48 KiB. A reference lives in exactly one of the two places;
//! a lookup that finds no order in the pages asks the hash map unless it is empty.
//!
//! An empty slot is an order of zero shares: the book never keeps one (zero-share adds are
//! refused, an order reduced to zero is removed).

use super::{prefetch_read, Order, Side};
use rustc_hash::FxHashMap;

/// Slots per page (4,096 orders of 12 bytes: 48 KiB).
const PAGE_BITS: u32 = 12;
const PAGE: usize = 1 << PAGE_BITS;
/// References below this are indexed directly; the page table then has at most 2^18 entries
/// (2 MiB). A NASDAQ day adds some 10^8 orders.
pub(super) const DIRECT_LIMIT: u64 = 1 << 30;
/// Freed pages kept for reuse, so a page boundary crossed back and forth does not allocate.
const SPARES: usize = 4;
/// Pages allowed whatever the number of live orders (3 MiB).
const FREE_PAGES: usize = 64;
/// Beyond [`FREE_PAGES`], one page per this many live orders (a quarter of a page).
const MIN_ORDERS_PER_PAGE: usize = PAGE / 4;

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
    /// Pages in `pages` (not counting spares).
    in_use: usize,
    spare: Vec<Page>,
    overflow: FxHashMap<u64, Order>,
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

    /// Starts loading the slot of `reference` into the cache: a hint, no effect on the
    /// state. A pass that knows its next messages calls it some messages ahead, so the miss
    /// on an order added long ago overlaps the work in between.
    #[inline]
    pub(super) fn prefetch(&self, reference: u64) {
        if let Some((p, i)) = split(reference) {
            if let Some(Some(page)) = self.pages.get(p) {
                prefetch_read(&page[i]);
            }
        }
    }

    fn slot(&self, reference: u64) -> Option<&Order> {
        let (p, i) = split(reference)?;
        let o = &self.pages.get(p)?.as_ref()?[i];
        (o.shares != 0).then_some(o)
    }

    pub(super) fn get(&self, reference: u64) -> Option<&Order> {
        match self.slot(reference) {
            Some(o) => Some(o),
            None if self.overflow.is_empty() => None,
            None => self.overflow.get(&reference),
        }
    }

    pub(super) fn get_mut(&mut self, reference: u64) -> Option<&mut Order> {
        if let Some((p, i)) = split(reference) {
            if let Some(Some(page)) = self.pages.get_mut(p) {
                if page[i].shares != 0 {
                    return Some(&mut page[i]);
                }
            }
        }
        self.overflow.get_mut(&reference)
    }

    pub(super) fn contains(&self, reference: u64) -> bool {
        self.get(reference).is_some()
    }

    /// Stores `order` (`shares > 0`) under a reference that is not live.
    pub(super) fn insert_new(&mut self, reference: u64, order: Order) {
        debug_assert!(order.shares != 0 && !self.contains(reference));
        self.len += 1;
        let Some((p, i)) = split(reference) else {
            self.overflow.insert(reference, order);
            return;
        };
        let have_page = self.pages.get(p).is_some_and(Option::is_some);
        if !have_page && self.in_use >= FREE_PAGES + self.len / MIN_ORDERS_PER_PAGE {
            self.overflow.insert(reference, order);
            return;
        }
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, || None);
            self.live.resize(p + 1, 0);
        }
        let (spare, in_use) = (&mut self.spare, &mut self.in_use);
        let page = self.pages[p].get_or_insert_with(|| {
            *in_use += 1;
            spare.pop().unwrap_or_else(|| Box::new([EMPTY; PAGE]))
        });
        page[i] = order;
        self.live[p] += 1;
    }

    /// Takes the order out, if it is live.
    pub(super) fn remove(&mut self, reference: u64) -> Option<Order> {
        if let Some((p, i)) = split(reference) {
            if let Some(Some(page)) = self.pages.get_mut(p) {
                if page[i].shares != 0 {
                    let o = std::mem::replace(&mut page[i], EMPTY);
                    self.len -= 1;
                    self.live[p] -= 1;
                    if self.live[p] == 0 {
                        self.in_use -= 1;
                        if let Some(page) = self.pages[p].take() {
                            if self.spare.len() < SPARES {
                                // Every slot is EMPTY again: the last order just left.
                                self.spare.push(page);
                            }
                        }
                    }
                    return Some(o);
                }
            }
        }
        let o = self.overflow.remove(&reference);
        self.len -= usize::from(o.is_some());
        o
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
        direct.chain(self.overflow.iter().map(|(&r, o)| (r, o)))
    }

    /// Room for `n` orders above the direct range (the direct pages need no reserving).
    pub(super) fn reserve_far(&mut self, n: usize) {
        self.overflow.reserve(n);
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

    /// References one per page stop taking pages once the budget is spent, and are still
    /// found, changed and removed in the hash map.
    #[test]
    fn scattered_references_stay_within_the_page_budget() {
        let mut m = Orders::default();
        let n = 3 * FREE_PAGES;
        let r = |k: usize| (k * PAGE + 5) as u64;
        for k in 0..n {
            m.insert_new(r(k), order(k as u32 + 1));
        }
        assert_eq!(m.len(), n);
        assert_eq!(m.in_use, FREE_PAGES);
        assert_eq!(m.overflow.len(), n - FREE_PAGES);
        for k in 0..n {
            assert_eq!(m.get(r(k)).map(|o| o.shares), Some(k as u32 + 1), "{k}");
            m.get_mut(r(k)).unwrap().shares = 7;
        }
        assert!(m.iter().all(|(_, o)| o.shares == 7));
        assert_eq!(m.iter().count(), n);
        // A dense run fills pages that exist; a page freed makes room for a new one.
        m.insert_new(r(0) + 1, order(1));
        assert_eq!(m.in_use, FREE_PAGES);
        assert_eq!(m.remove(r(1)), Some(order(7)));
        assert_eq!(m.in_use, FREE_PAGES - 1);
        let fresh = (10_000 * PAGE) as u64;
        m.insert_new(fresh, order(2));
        assert_eq!(m.in_use, FREE_PAGES);
        assert_eq!(m.get(fresh), Some(&order(2)));
        for k in (0..n).filter(|&k| k != 1) {
            assert_eq!(m.remove(r(k)), Some(order(7)), "{k}");
            assert_eq!(m.get(r(k)), None);
        }
        assert_eq!(m.len(), 2);
        assert!(m.overflow.is_empty());
    }
}
