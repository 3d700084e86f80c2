//! The scenarios `dlock bench` runs, one module each.

pub(crate) mod blocking;
pub(crate) mod handoff;
pub(crate) mod many;
pub(crate) mod serve_scrape;
pub(crate) mod uncontended;
pub(crate) mod watchdog;
