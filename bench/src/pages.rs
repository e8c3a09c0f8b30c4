//! `--hugepages` of the orders and market-data harnesses: whether the memory they register
//! (rings, staging, receive pools, history) lives on 2 MiB huge pages, as `[rdma] hugepages`
//! sets it for the services. Off by default, the library's own default, so figures taken
//! without the flag mean what they meant before it.

use rocebus::rdma_settings::HugePages;

/// The page policy a harness registers its memory with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pages {
    /// 4 KiB pages.
    #[default]
    Off,
    /// Huge pages when the kernel has free ones, else 4 KiB pages (counted as fallbacks).
    Auto,
    /// Huge pages or an error: a run never measures 4 KiB pages by accident.
    On,
}

impl Pages {
    /// Sets this process's policy; call before anything is registered.
    pub fn apply(self) {
        rocebus::verbs::set_huge_pages(match self {
            Pages::Off => HugePages::Off,
            Pages::Auto => HugePages::Auto,
            Pages::On => HugePages::On,
        });
    }
}

/// One line on this process's registered memory now (call while it is all registered):
/// how much, how much of it on huge pages, and how many allocations fell back.
pub fn report(harness: &str) {
    let m = rocebus::verbs::registered_memory();
    println!(
        "{harness}: registered memory {} KiB, {} KiB of it on 2 MiB huge pages, {} fallbacks to 4 KiB pages",
        m.bytes / 1024,
        m.huge_page_bytes / 1024,
        m.huge_page_fallbacks
    );
}
