//! Code point classification and the GPT-2 byte mapping, as llama.cpp's unicode.cpp has them.
//!
//! llama.cpp does not use a Unicode library: its pre-tokenizers read per-code-point flags from
//! its own tables (unicode-data.cpp, generated from one Unicode version). Matching its token ids
//! means using the same flags, so `unicode_data.rs` is generated from those tables
//! (tools/gen_unicode_tables.py) rather than taken from Rust's `char` methods.

use super::unicode_data::{FLAG_RUNS, LOWER_TO_ASCII};

/// llama.cpp's `unicode_cpt_flags`, as the 16-bit value `as_uint()` returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CptFlags(pub u16);

impl CptFlags {
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const MASK_CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100;

    /// The flags of a code point; code points past U+10FFFF have none (as in llama.cpp).
    pub fn of(cpt: u32) -> CptFlags {
        if cpt >= 0x11_0000 {
            return CptFlags(0);
        }
        // FLAG_RUNS starts at 0 and is sorted, so the partition point is at least 1.
        let i = FLAG_RUNS.partition_point(|&(start, _)| start <= cpt);
        CptFlags(FLAG_RUNS[i - 1].1)
    }

    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// `as_uint() != 0`: any flag at all. Only positions outside the text have none.
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// `category_flag()`: the category bits alone.
    pub fn category(self) -> u16 {
        self.0 & Self::MASK_CATEGORIES
    }
}

/// `unicode_tolower`, as far as it can be observed by comparing the result with ASCII
/// letters (the only use the splitters make of it): code points whose lowercase form is not
/// ASCII are returned unchanged, which cannot equal an ASCII letter either way.
pub(crate) fn tolower_for_ascii_compare(cpt: u32) -> u32 {
    match LOWER_TO_ASCII.binary_search_by_key(&cpt, |&(c, _)| c) {
        Ok(i) => LOWER_TO_ASCII[i].1,
        Err(_) => cpt,
    }
}

/// GPT-2's byte-to-code-point table (`bytes_to_unicode`): printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cpt = if printable {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        // All values are below U+0200, valid scalar values.
        *slot = char::from_u32(cpt).expect("GPT-2 byte map stays below U+0200");
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_common_code_points() {
        assert!(CptFlags::of('a' as u32).is_letter());
        assert!(CptFlags::of('é' as u32).is_letter());
        assert!(CptFlags::of('中' as u32).is_letter());
        assert!(CptFlags::of('7' as u32).is_number());
        assert!(CptFlags::of('٣' as u32).is_number());
        assert!(CptFlags::of(' ' as u32).is_whitespace());
        assert!(CptFlags::of(0x3000).is_whitespace());
        assert!(CptFlags::of('\n' as u32).is_whitespace());
        assert_eq!(CptFlags::of('!' as u32).category(), CptFlags::PUNCTUATION);
        assert_eq!(CptFlags::of('+' as u32).category(), CptFlags::SYMBOL);
        assert_eq!(CptFlags::of(0x0301).category(), CptFlags::ACCENT_MARK);
        assert!(!CptFlags::of(0x11_0000).any());
        // Unassigned code points are flagged UNDEFINED, so still "any".
        assert!(CptFlags::of(0x0378).any());
    }

    #[test]
    fn gpt2_byte_map() {
        let t = byte_to_char_table();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        let mut all: Vec<char> = t.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256, "the map is a bijection");
    }

    #[test]
    fn tolower() {
        assert_eq!(tolower_for_ascii_compare('S' as u32), 's' as u32);
        assert_eq!(tolower_for_ascii_compare('s' as u32), 's' as u32);
        assert_eq!(tolower_for_ascii_compare(0x212A), 'k' as u32); // KELVIN SIGN
    }
}
