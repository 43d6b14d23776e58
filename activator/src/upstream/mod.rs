//! Connections to pods and peer activators, and carrying a request over them with hyper:
//! the HTTP/1.1 and h2c pools, idle connections, the reuse check, upgrades (tunnels), and the
//! body idle timeout.

pub mod body_timeout;
pub mod conn_check;
pub mod h1;
pub mod h2c;
pub mod idle;
pub mod proxy;
pub mod upgrade;
