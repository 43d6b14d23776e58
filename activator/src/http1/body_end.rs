//! Where a response body ends, by its framing (RFC 9112 §6.3): the fast lane relays the
//! app's body as it is and needs only to know where the message ends, so that the connection
//! can carry the next one. Pure: no IO.

use super::chunked::ChunkedEnd;
use super::response_head::BodyFraming;

/// Where a response body ends, by its framing.
pub(crate) struct BodyEnd {
    framing: BodyFraming,
    left: u64,
    chunks: ChunkedEnd,
    done: bool,
}

impl BodyEnd {
    pub(crate) fn new(framing: BodyFraming) -> Self {
        let left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        Self {
            framing,
            left,
            chunks: ChunkedEnd::default(),
            done: framing == BodyFraming::Empty,
        }
    }

    /// Whether the body ends only when the pod closes the connection.
    pub(crate) fn until_close(&self) -> bool {
        self.framing == BodyFraming::UntilClose
    }

    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// How many of the bytes at the start of `resp` belong to the body.
    pub(crate) fn take(&mut self, resp: &[u8]) -> Result<usize, ()> {
        let n = match self.framing {
            BodyFraming::Empty => 0,
            BodyFraming::Length(_) => {
                let n = self.left.min(resp.len() as u64);
                self.left -= n;
                self.done = self.left == 0;
                n as usize
            }
            BodyFraming::Chunked => {
                let n = self.chunks.feed(resp).map_err(|_| ())?;
                self.done = self.chunks.done();
                n
            }
            BodyFraming::UntilClose => resp.len(),
        };
        Ok(n)
    }
}
