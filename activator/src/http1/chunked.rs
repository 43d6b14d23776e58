//! Finding the end of a chunked body (RFC 9112 §7.1) while its bytes pass through unchanged:
//! the fast lane relays the app's chunks as they are and needs only to know where the
//! message ends, so that the connection can carry the next one. Pure: no IO.
//!
//! Strict, as hyper's decoder is: every line ends in CRLF (a bare LF is refused, since a
//! client that accepts it would find a different end than one that does not), a size is hex
//! digits followed only by optional whitespace, extensions or the CRLF; extensions and
//! trailers hold no control characters and are bounded. Anything else is [`Malformed`]: the
//! client connection closes rather than carry bytes two parsers could frame differently.

/// Bytes of chunk extensions a body may carry in all (hyper's limit).
const MAX_EXTENSIONS: u32 = 16 * 1024;
/// Bytes of trailer fields a body may carry (hyper's limit).
const MAX_TRAILERS: u32 = 16 * 1024;

/// Where the tracker is in the chunked stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size's hex digits.
    Size {
        digits: u8,
        size: u64,
    },
    /// Whitespace after the size (before an extension or the line end).
    SizeWs {
        size: u64,
    },
    /// In an extension, up to the line's CR.
    Ext {
        size: u64,
    },
    /// The LF after a size line's CR.
    SizeLf {
        size: u64,
    },
    /// Inside a chunk's data.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataCr,
    DataLf,
    /// At the start of a trailer line (the last chunk was seen).
    TrailerStart,
    /// Inside a trailer field line, and its LF.
    Trailer,
    TrailerLf,
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
    extensions: u32,
    trailers: u32,
}

impl Default for ChunkedEnd {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0, size: 0 },
            extensions: 0,
            trailers: 0,
        }
    }
}

/// A control character other than HTAB (none may appear in an extension or a field line).
fn is_ctl(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
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

    fn step(&mut self, b: u8) -> Result<State, Malformed> {
        Ok(match self.state {
            State::Size { digits, size } => match (b as char).to_digit(16) {
                // 15 hex digits: sizes up to 2^60, more than any body.
                Some(d) if digits < 15 => State::Size {
                    digits: digits + 1,
                    size: size * 16 + u64::from(d),
                },
                None if digits > 0 => match b {
                    b'\r' => State::SizeLf { size },
                    b';' => State::Ext { size },
                    b' ' | b'\t' => State::SizeWs { size },
                    _ => return Err(Malformed),
                },
                _ => return Err(Malformed),
            },
            State::SizeWs { size } => match b {
                b' ' | b'\t' => State::SizeWs { size },
                b';' => State::Ext { size },
                b'\r' => State::SizeLf { size },
                _ => return Err(Malformed),
            },
            State::Ext { size } => {
                self.extensions += 1;
                match b {
                    b'\r' => State::SizeLf { size },
                    _ if is_ctl(b) || self.extensions > MAX_EXTENSIONS => return Err(Malformed),
                    _ => State::Ext { size },
                }
            }
            State::SizeLf { size } => match b {
                b'\n' if size == 0 => State::TrailerStart,
                b'\n' => State::Data(size),
                _ => return Err(Malformed),
            },
            State::Data(_) => unreachable!("data is skipped in feed"),
            State::DataCr => match b {
                b'\r' => State::DataLf,
                _ => return Err(Malformed),
            },
            State::DataLf => match b {
                b'\n' => State::Size { digits: 0, size: 0 },
                _ => return Err(Malformed),
            },
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                // A field line starts with a name: no whitespace (obs-fold) and no control.
                b' ' | b'\t' => return Err(Malformed),
                _ if is_ctl(b) => return Err(Malformed),
                _ => self.trailer()?,
            },
            State::Trailer => match b {
                b'\r' => State::TrailerLf,
                _ if is_ctl(b) => return Err(Malformed),
                _ => self.trailer()?,
            },
            State::TrailerLf => match b {
                b'\n' => State::TrailerStart,
                _ => return Err(Malformed),
            },
            State::EndLf => match b {
                b'\n' => State::Done,
                _ => return Err(Malformed),
            },
            State::Done => State::Done,
        })
    }

    fn trailer(&mut self) -> Result<State, Malformed> {
        self.trailers += 1;
        if self.trailers > MAX_TRAILERS {
            return Err(Malformed);
        }
        Ok(State::Trailer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BODY: &[u8] =
        b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\ngrpc-status: 0\r\n\r\n";

    #[test]
    fn whitespace_and_extensions_after_a_size_are_taken() {
        let mut c = ChunkedEnd::default();
        let body = b"3 \t;a=1;b=\"x y\"\r\nabc\r\n0\r\n\r\n";
        assert_eq!(c.feed(body), Ok(body.len()));
        assert!(c.done());
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(std::iter::repeat_n(b'a', MAX_EXTENSIONS as usize + 1));
        assert_eq!(ChunkedEnd::default().feed(&long_ext), Err(Malformed));
        let mut long_trailer = b"0\r\nx: ".to_vec();
        long_trailer.extend(std::iter::repeat_n(b'a', MAX_TRAILERS as usize + 1));
        assert_eq!(ChunkedEnd::default().feed(&long_trailer), Err(Malformed));
    }

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
            // Bare LF after a size, after data, in the trailers and at the end.
            b"5\nhello\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"0\r\nx: 1\n\r\n",
            b"0\r\n\n",
            b"5;ext\nhello",
            // A CR that ends no line, a control character in an extension, an obs-fold.
            b"5\rhello",
            b"5;a\x01b\r\n",
            b"0\r\nx: 1\r\n folded\r\n\r\n",
            // Whitespace then anything but an extension or the line end.
            b"5 x\r\n",
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
