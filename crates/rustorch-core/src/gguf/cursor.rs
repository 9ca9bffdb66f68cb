//! A bounds-checked little-endian reader over the file's bytes.
//!
//! Every read checks the remaining length first, and every length or count
//! read from the file is checked against the remaining bytes before anything
//! is allocated for it, so a corrupt header cannot ask for more memory than
//! the file itself takes.

use super::error::{GgufError, Result};
use std::fmt;

/// Where in the file a read happens, for error messages. Built for every
/// read but formatted only when an error is reported.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Site<'s> {
    Header(&'static str),
    KeyName(u64),
    KeyType(&'s str),
    Value(&'s str),
    TensorName(u64),
    Tensor(&'s str, &'static str),
}

impl fmt::Display for Site<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Header(field) => f.write_str(field),
            Site::KeyName(i) => write!(f, "key of metadata entry #{i}"),
            Site::KeyType(k) => write!(f, "value type of metadata key {k:?}"),
            Site::Value(k) => write!(f, "value of metadata key {k:?}"),
            Site::TensorName(i) => write!(f, "name of tensor #{i}"),
            Site::Tensor(name, field) => write!(f, "{field} of tensor {name:?}"),
        }
    }
}

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// The current byte offset in the file.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes, or `Truncated`.
    pub(crate) fn bytes(&mut self, n: u64, site: Site<'_>) -> Result<&'a [u8]> {
        let avail = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= avail => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                what: site.to_string(),
                offset: self.pos(),
                needed: n,
                available: avail as u64,
            }),
        }
    }

    pub(crate) fn array<const N: usize>(&mut self, site: Site<'_>) -> Result<[u8; N]> {
        let s = self.bytes(N as u64, site)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u32(&mut self, site: Site<'_>) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(site)?))
    }

    pub(crate) fn u64(&mut self, site: Site<'_>) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(site)?))
    }

    /// Reads a count of items each at least `min_item` bytes long and checks
    /// that the rest of the file could hold them. The result is safe to
    /// pre-allocate for. `what` names the count within `site` (empty when
    /// the site is the count itself).
    pub(crate) fn count(&mut self, min_item: u64, what: &str, site: Site<'_>) -> Result<usize> {
        let at = self.pos();
        let n = self.u64(site)?;
        let avail = self.remaining() as u64;
        match n.checked_mul(min_item) {
            Some(need) if need <= avail => Ok(n as usize),
            _ => Err(GgufError::LengthTooLarge {
                what: if what.is_empty() {
                    site.to_string()
                } else {
                    format!("{what} in {site}")
                },
                offset: at,
                value: n,
                available: avail,
            }),
        }
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes.
    pub(crate) fn string(&mut self, site: Site<'_>) -> Result<String> {
        let len = self.count(1, "string length", site)?;
        let at = self.pos();
        let s = self.bytes(len as u64, site)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                what: site.to_string(),
                offset: at + e.valid_up_to() as u64,
            }),
        }
    }
}
