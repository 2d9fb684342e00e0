//! Whether the client at the other end of a connection has hung up, asked of the socket itself.
//!
//! Connections are served half-closed (hyper's `half_close`): a client may send its request and
//! shut down its sending side (`shutdown(SHUT_WR)`, HTTP/1.0 tools, `nc -N`) and still read the
//! response. hyper then no longer ends the connection when the client's side ends, so a client
//! that leaves while its whole (non-streamed) response is being generated would go unnoticed
//! until the write. A generation asks [`Peer::hung_up`] between tokens instead: the end of the
//! client's stream seen *after* the request started means the client left, as llama.cpp's
//! server reads it; seen before, it was a half-close that is waiting for its answer.
//!
//! This file owns the peek and nothing else; the slots decide what a hang-up stops.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// A duplicate of a connection's socket, for peeking only.
#[derive(Debug)]
pub struct Peer(OwnedFd);

impl Peer {
    /// A peer for `socket`, or `None` when its descriptor cannot be duplicated (out of
    /// descriptors): the connection is then served without the check.
    pub fn of(socket: &impl AsFd) -> Option<Peer> {
        socket.as_fd().try_clone_to_owned().ok().map(Peer)
    }

    /// Whether the client's side of the connection has ended (orderly or reset). Data waiting
    /// to be read (a pipelined request) means it has not. Never blocks: the socket is in
    /// non-blocking mode, and the peek says so explicitly too.
    pub fn hung_up(&self) -> bool {
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into a live local buffer, on a descriptor this value owns.
        let n = unsafe {
            libc::recv(
                self.0.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => {
                let err = std::io::Error::last_os_error();
                !matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};

    #[test]
    fn a_peer_is_up_until_the_client_shuts_its_side_and_pending_data_keeps_it_up() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let peer = Peer::of(&server).unwrap();
        assert!(!peer.hung_up());
        client.write_all(b"x").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // A byte still waits to be read: not hung up yet, however the stream ends.
        assert!(!peer.hung_up());
        let mut buf = [0u8; 1];
        std::io::Read::read(&mut &server, &mut buf).unwrap();
        assert!(peer.hung_up());
    }
}
