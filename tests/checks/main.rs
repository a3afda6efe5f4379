//! The hermetic tier: what a plain `cargo test` runs, without root, a cluster, Redis or any
//! tool beyond the toolchain and a shell. Pure checks of the repository (layout, docs, the CRD,
//! the chart's values) and hostile input (docs/testing.md, "Tiers").

mod chart;
mod cli;
mod crd;
mod docs;
mod hostile_input;
mod layout;
