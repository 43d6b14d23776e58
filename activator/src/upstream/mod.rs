//! Connections to pods and peer activators, and carrying a request over them with hyper:
//! the HTTP/1.1 and h2c pools, idle connections, the reuse check, upgrades (tunnels), and the
//! body idle timeout.

pub(crate) mod body_timeout;
pub(crate) mod conn_check;
pub(crate) mod h1;
pub(crate) mod h2c;
pub(crate) mod idle;
pub mod proxy;
pub(crate) mod upgrade;
