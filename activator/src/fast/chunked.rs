//! Finding the end of a chunked body (RFC 9112 §7.1) while its bytes pass through unchanged:
//! the fast lane relays the app's chunks as they are and needs only to know where the
//! message ends, so that the connection can carry the next one. Pure: no IO.

/// Where the tracker is in the chunked stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size's hex digits.
    Size {
        digits: u8,
        size: u64,
    },
    /// After the size: extensions, up to the line's LF.
    SizeLine {
        size: u64,
    },
    /// Inside a chunk's data.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataCr,
    DataLf,
    /// At the start of a trailer line (the last chunk was seen).
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    /// The LF of the empty line that ends the message.
    EndLf,
    Done,
}

/// A chunked body that does not parse: the connection cannot be trusted with another message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Follows a chunked body through the bytes it is fed.
#[derive(Debug, Clone, Copy)]
pub struct ChunkedEnd {
    state: State,
}

impl Default for ChunkedEnd {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0, size: 0 },
        }
    }
}

impl ChunkedEnd {
    /// Feeds the next bytes of the body. Returns how many of them belong to it: all of them
    /// while it goes on, fewer once its end is among them (what follows is not its).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == State::Done {
                return Ok(i);
            }
            // Chunk data is skipped in one step, not byte by byte.
            if let State::Data(left) = self.state {
                let take = left.min((bytes.len() - i) as u64);
                i += take as usize;
                self.state = if take == left {
                    State::DataCr
                } else {
                    State::Data(left - take)
                };
                continue;
            }
            self.state = self.step(bytes[i])?;
            i += 1;
        }
        Ok(i)
    }

    /// The whole body has been seen.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    fn step(&self, b: u8) -> Result<State, Malformed> {
        Ok(match self.state {
            State::Size { digits, size } => match (b as char).to_digit(16) {
                // 15 hex digits: sizes up to 2^60, more than any body.
                Some(d) if digits < 15 => State::Size {
                    digits: digits + 1,
                    size: size * 16 + u64::from(d),
                },
                None if digits > 0 => match b {
                    b'\n' => after_size(size),
                    b';' | b' ' | b'\t' | b'\r' => State::SizeLine { size },
                    _ => return Err(Malformed),
                },
                _ => return Err(Malformed),
            },
            State::SizeLine { size } => match b {
                b'\n' => after_size(size),
                _ => State::SizeLine { size },
            },
            State::Data(_) => unreachable!("data is skipped in feed"),
            State::DataCr => match b {
                b'\r' => State::DataLf,
                b'\n' => State::Size { digits: 0, size: 0 },
                _ => return Err(Malformed),
            },
            State::DataLf => match b {
                b'\n' => State::Size { digits: 0, size: 0 },
                _ => return Err(Malformed),
            },
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                b'\n' => State::Done,
                _ => State::Trailer,
            },
            State::Trailer => match b {
                b'\n' => State::TrailerStart,
                _ => State::Trailer,
            },
            State::EndLf => match b {
                b'\n' => State::Done,
                _ => return Err(Malformed),
            },
            State::Done => State::Done,
        })
    }
}

fn after_size(size: u64) -> State {
    if size == 0 {
        State::TrailerStart
    } else {
        State::Data(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BODY: &[u8] =
        b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\ngrpc-status: 0\r\n\r\n";

    #[test]
    fn the_end_is_found_and_what_follows_is_left() {
        let mut c = ChunkedEnd::default();
        let mut stream = BODY.to_vec();
        stream.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(c.feed(&stream), Ok(BODY.len()));
        assert!(c.done());
        let mut bare = ChunkedEnd::default();
        assert_eq!(bare.feed(b"0\r\n\r\n"), Ok(5));
        assert!(bare.done());
    }

    #[test]
    fn broken_chunks_are_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloX",
            b"fffffffffffffffff\r\n",
        ] {
            assert_eq!(ChunkedEnd::default().feed(bad), Err(Malformed), "{bad:?}");
        }
    }

    proptest! {
        /// However the body is split into reads, the end is found at the same place.
        #[test]
        fn any_split_finds_the_same_end(cuts in proptest::collection::vec(0..BODY.len(), 0..8)) {
            let mut cuts = cuts;
            cuts.push(BODY.len());
            cuts.sort_unstable();
            cuts.dedup();
            let mut c = ChunkedEnd::default();
            let mut at = 0;
            for cut in cuts {
                prop_assert!(!c.done());
                prop_assert_eq!(c.feed(&BODY[at..cut]), Ok(cut - at));
                at = cut;
            }
            prop_assert!(c.done());
        }
    }
}
