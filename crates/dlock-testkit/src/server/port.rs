//! Free-port helper for test servers.

use std::io;
use std::net::{Ipv4Addr, TcpListener};

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The kernel picks the port (bind to port 0); the listener is closed before
/// returning, so another process can still grab the port before the server
/// binds it. [`ServerProcess::start`](super::ServerProcess::start) handles
/// that race by retrying on "address already in use".
///
/// ```no_run
/// let port = dlock_testkit::server::free_port()?;
/// assert_ne!(port, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
