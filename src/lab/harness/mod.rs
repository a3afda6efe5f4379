//! Real parts to break: `redis-server` processes on free loopback ports, a fault-injecting TCP
//! proxy, and a movable wall clock. Used by the lab and by the integration tests; everything
//! started is stopped when its handle drops.

mod clock;
mod error;
mod nodes;
mod proxy;

pub use clock::{SkewedClock, SKEW_FILE_ENV};
pub use error::{free_port, HarnessError};
pub use nodes::{NodeTls, Persistence, RedisNode, RedisNodes};
pub use proxy::{FaultProxy, ProxyMode};
