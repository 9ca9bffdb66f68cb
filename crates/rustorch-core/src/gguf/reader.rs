//! `Gguf`: a parsed GGUF file over its mapped (or owned) bytes.

use super::error::{GgufError, Result};
use super::metadata::Metadata;
use super::parse::{parse, Parsed};
use super::tensor::{self, LoadedTensor, TensorInfo};
use super::value::{Array, Value};
use crate::tensor::Tensor;
use std::fs::File;
use std::path::Path;

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A GGUF file (version 2 or 3, little-endian): metadata, tensor table, and
/// zero-copy access to tensor bytes.
///
/// Everything is validated when the file is opened, so the accessors below
/// only fail on a missing name or a type mismatch.
pub struct Gguf {
    bytes: Bytes,
    parsed: Parsed,
}

macro_rules! forward_getters {
    ($($name:ident -> $t:ty),* $(,)?) => {$(
        #[doc = concat!("Shorthand for `self.metadata().", stringify!($name), "(key)`.")]
        pub fn $name(&self, key: &str) -> Result<$t> {
            self.parsed.metadata.$name(key)
        }
    )*};
}

impl Gguf {
    /// Maps and parses a file.
    ///
    /// The map is read-only. As with any memory map, another process that
    /// truncates or rewrites the file while it is open makes later reads
    /// undefined; do not modify model files while they are loaded.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io = |action, source| GgufError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        let bytes = if len == 0 {
            // Mapping an empty file fails on some systems; there is nothing
            // to map anyway, and parsing reports it as truncated.
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this value; see the
            // caveat above about files modified while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("map", e))?;
            Bytes::Mapped(map)
        };
        Gguf::from_parts(bytes)
    }

    /// Parses a GGUF image held in memory (copies it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Gguf> {
        Gguf::from_parts(Bytes::Owned(bytes.to_vec()))
    }

    /// Parses a GGUF image held in memory, taking ownership.
    pub fn from_vec(bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::from_parts(Bytes::Owned(bytes))
    }

    fn from_parts(bytes: Bytes) -> Result<Gguf> {
        let parsed = parse(bytes.as_slice())?;
        Ok(Gguf { bytes, parsed })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// The data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.parsed.alignment
    }

    /// Bytes taken by the header, metadata and tensor infos, before the
    /// padding that precedes the data section.
    pub fn header_len(&self) -> u64 {
        self.parsed.header_len
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Whether the bytes are a memory map (rather than a copy in memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }

    /// Removes a metadata entry, returning its value. A loader that has read
    /// a large array (a tokenizer's quarter-million token strings) can free
    /// it before the weights are copied, lowering peak memory.
    pub fn remove_metadata(&mut self, key: &str) -> Option<Value> {
        self.parsed.metadata.remove(key)
    }

    /// Releases the mapped pages of the header (metadata and tensor table),
    /// as `release` does for a tensor: parsing read them all, and nothing
    /// needs them again.
    pub fn release_header(&self) {
        self.release_range(0, self.parsed.data_offset as usize);
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.parsed.metadata.get(key)
    }

    forward_getters!(
        get_u8 -> u8, get_i8 -> i8, get_u16 -> u16, get_i16 -> i16, get_u32 -> u32,
        get_i32 -> i32, get_u64 -> u64, get_i64 -> i64, get_f32 -> f32, get_f64 -> f64,
        get_bool -> bool, get_str -> &str, get_array -> &Array, get_usize -> usize,
        get_u8_array -> &[u8], get_i8_array -> &[i8], get_u16_array -> &[u16],
        get_i16_array -> &[i16], get_u32_array -> &[u32], get_i32_array -> &[i32],
        get_u64_array -> &[u64], get_i64_array -> &[i64], get_f32_array -> &[f32],
        get_f64_array -> &[f64], get_bool_array -> &[bool], get_str_array -> &[String],
    );

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.parsed
            .tensor_index
            .get(name)
            .map(|&i| &self.parsed.tensors[i])
            .ok_or_else(|| GgufError::TensorNotFound { name: name.to_string() })
    }

    /// The bytes of a tensor, borrowed from the map.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        Ok(self.data_of(info))
    }

    /// The bytes of a tensor from this file's table.
    pub fn data_of(&self, info: &TensorInfo) -> &[u8] {
        // The parser checked data_offset + offset + n_bytes <= file length,
        // so the range is in bounds; `get` keeps even a foreign info safe.
        let start = self.parsed.data_offset.saturating_add(info.offset) as usize;
        let end = start.saturating_add(info.n_bytes);
        self.as_bytes().get(start..end).unwrap_or(&[])
    }

    /// Tells the kernel that a tensor's bytes in a memory-mapped file will
    /// not be read again soon, so that their pages leave this process's
    /// resident memory (the file stays mapped; a later read brings them
    /// back from the file). A loader that copies weights out of the map
    /// calls this after each copy, so that the process never holds both the
    /// mapped file and its copy. Nothing happens for files read into memory.
    pub fn release(&self, info: &TensorInfo) {
        let start = self.parsed.data_offset.saturating_add(info.offset) as usize;
        self.release_range(start, info.n_bytes);
    }

    /// A copy of a tensor's bytes that, for a mapped file, releases the
    /// mapped pages slice by slice as it copies them (see `release`). A
    /// whole-tensor copy followed by `release` briefly holds both the mapped
    /// pages and the copy: for Gemma 3's 170 MB embedding table that
    /// transient alone would push peak memory far above the file size.
    pub fn copy_out(&self, info: &TensorInfo) -> Vec<u8> {
        // Small enough that the transient is negligible, large enough that
        // the madvise calls cost nothing next to the copy.
        const SLICE: usize = 4 << 20;
        let src = self.data_of(info);
        let base = self.parsed.data_offset.saturating_add(info.offset) as usize;
        let mut out = Vec::with_capacity(src.len());
        crate::huge_pages::advise(&mut out);
        // Slices copied on all threads: most of a load is page faults (the
        // copy's fresh pages, zeroed by the kernel, and the file's), which
        // proceed side by side.
        use rayon::prelude::*;
        out.spare_capacity_mut()[..src.len()]
            .par_chunks_mut(SLICE)
            .zip(src.par_chunks(SLICE))
            .enumerate()
            .for_each(|(i, (dst, part))| {
                // SAFETY: `dst` and `part` have the same length (chunks of
                // equal slices), and `dst` is the Vec's own uninitialized
                // capacity, which nothing else references.
                unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), dst.as_mut_ptr().cast::<u8>(), part.len()) };
                self.release_range(base + i * SLICE, part.len());
            });
        // SAFETY: every byte of 0..src.len() was written above.
        unsafe { out.set_len(src.len()) };
        out
    }

    /// `release` for a byte range of the file.
    fn release_range(&self, start: usize, len: usize) {
        if let Bytes::Mapped(map) = &self.bytes {
            let len = len.min(map.len().saturating_sub(start));
            if len == 0 {
                return;
            }
            // SAFETY: the map is a read-only shared mapping of the file
            // (`Mmap::map`), never written, so MADV_DONTNEED only drops clean
            // pages, and any later access reads the same bytes back from the
            // file. Slices into the map stay valid. A failed advice changes
            // nothing, so its error is ignored.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
        }
    }

    /// An F32, F16, BF16, F64, I32 or I64 tensor as a `Tensor` (a copy, in
    /// row-major shape `info.shape()`). Other types give `NotDense`.
    pub fn to_tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensor_info(name)?;
        tensor::to_tensor(info, self.data_of(info))
    }

    /// A dense tensor as a `Tensor`, anything else (quantized blocks, I8,
    /// I16) as its bytes and type.
    pub fn load_tensor(&self, name: &str) -> Result<LoadedTensor<'_>> {
        let info = self.tensor_info(name)?;
        let bytes = self.data_of(info);
        if tensor::dense_dtype(info.qtype).is_some() {
            Ok(LoadedTensor::Dense(tensor::to_tensor(info, bytes)?))
        } else {
            Ok(LoadedTensor::Raw { info, bytes })
        }
    }
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.parsed.version)
            .field("alignment", &self.parsed.alignment)
            .field("metadata_entries", &self.parsed.metadata.len())
            .field("tensors", &self.parsed.tensors.len())
            .field("data_offset", &self.parsed.data_offset)
            .field("bytes", &self.as_bytes().len())
            .finish()
    }
}
