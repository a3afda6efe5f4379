//! The quickstart and the soak: dev tools that run the operator on two local clusters sharing
//! local Redis nodes.

pub mod clusters;
pub mod soak;
