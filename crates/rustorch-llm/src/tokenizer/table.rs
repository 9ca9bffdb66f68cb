//! Compact storage for a vocabulary's texts.
//!
//! Gemma 3 has 262144 tokens. Held as one `String` per token, plus a `String`-keyed map for
//! text-to-id lookup and one `Vec<u8>` per decoded piece, its vocabulary cost about 50 MB of
//! heap, a fifth of the model's weights; the peak-memory budget (file + KV cache + 15%) has no
//! room for that. Here every text lives in one buffer, indexed by end offsets, and the lookup
//! table holds only ids (hashing the text the id points to): about 10 MB for Gemma 3.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

/// Byte strings `0..len()`, stored back to back.
#[derive(Debug, Default, Clone)]
pub(crate) struct Strings {
    bytes: Vec<u8>,
    /// `bytes[ends[i - 1]..ends[i]]` is string `i` (from 0 for `i == 0`).
    ends: Vec<u32>,
}

impl Strings {
    pub fn with_capacity(n: usize, bytes: usize) -> Strings {
        Strings {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends a string; `None` when the total would pass `u32::MAX` bytes.
    pub fn push(&mut self, s: &[u8]) -> Option<()> {
        let end = u32::try_from(self.bytes.len() + s.len()).ok()?;
        self.bytes.extend_from_slice(s);
        self.ends.push(end);
        Some(())
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(&self.bytes[start..end])
    }

    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// Byte-string keys with an index from key to id. Keys are unique.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyTable {
    keys: Strings,
    /// Ids, placed by the hash of their key.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

/// Why a table refused a key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The key is already in the table, under this id.
    Duplicate(u32),
    /// The table would pass `u32::MAX` bytes or ids.
    TooLarge,
}

impl KeyTable {
    pub fn with_capacity(n: usize, bytes: usize) -> KeyTable {
        KeyTable {
            keys: Strings::with_capacity(n, bytes),
            index: HashTable::with_capacity(n),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// Appends a key as the next id.
    pub fn push(&mut self, key: &[u8]) -> Result<u32, PushError> {
        if let Some(id) = self.id_of(key) {
            return Err(PushError::Duplicate(id));
        }
        let id = u32::try_from(self.keys.len()).map_err(|_| PushError::TooLarge)?;
        self.keys.push(key).ok_or(PushError::TooLarge)?;
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index
            .insert_unique(hasher.hash_one(key), id, |&other| hasher.hash_one(key_of(keys, other)));
        Ok(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn get(&self, id: u32) -> Option<&[u8]> {
        self.keys.get(id as usize)
    }

    pub fn id_of(&self, key: &[u8]) -> Option<u32> {
        self.index
            .find(self.hasher.hash_one(key), |&id| key_of(&self.keys, id) == key)
            .copied()
    }

    pub fn shrink_to_fit(&mut self) {
        self.keys.shrink_to_fit();
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index.shrink_to_fit(|&id| hasher.hash_one(key_of(keys, id)));
    }
}

fn key_of(keys: &Strings, id: u32) -> &[u8] {
    keys.get(id as usize).expect("the index holds only ids of stored keys")
}

/// Token texts with an index from text to id. Texts are unique.
#[derive(Debug, Default, Clone)]
pub(crate) struct TextTable(KeyTable);

impl TextTable {
    pub fn with_capacity(n: usize, bytes: usize) -> TextTable {
        TextTable(KeyTable::with_capacity(n, bytes))
    }

    /// Appends a text as the next id.
    pub fn push(&mut self, text: &str) -> Result<u32, PushError> {
        self.0.push(text.as_bytes())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The text of `id`.
    pub fn get(&self, id: u32) -> Option<&str> {
        self.0
            .get(id)
            .map(|b| std::str::from_utf8(b).expect("only whole `&str` texts are pushed"))
    }

    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.0.id_of(text.as_bytes())
    }

    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_round_trip_and_index() {
        let mut t = TextTable::with_capacity(0, 0);
        let words = ["a", "", "héllo", "▁the", "<0x0A>", "ab"];
        for (i, w) in words.iter().enumerate() {
            assert_eq!(t.push(w), Ok(i as u32));
        }
        t.shrink_to_fit();
        assert_eq!(t.len(), words.len());
        for (i, w) in words.iter().enumerate() {
            assert_eq!(t.get(i as u32), Some(*w));
            assert_eq!(t.id_of(w), Some(i as u32));
        }
        assert_eq!(t.push("héllo"), Err(PushError::Duplicate(2)));
        assert_eq!(t.id_of("abc"), None);
        assert_eq!(t.get(6), None);
    }

    #[test]
    fn strings_hold_bytes() {
        let mut s = Strings::default();
        s.push(b"\xff\x00").unwrap();
        s.push(b"").unwrap();
        assert_eq!(s.get(0), Some(&b"\xff\x00"[..]));
        assert_eq!(s.get(1), Some(&b""[..]));
        assert_eq!(s.get(2), None);
    }
}
