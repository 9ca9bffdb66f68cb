//! Parses arbitrary bytes as GGUF and walks everything a parsed file offers.
//! Any panic, overflow, out-of-bounds access or runaway allocation is a bug.
//! Run: RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_parse (see docs/GGUF.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustorch_core::gguf::{Gguf, GgufWriter, LoadedTensor};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data) else {
        return;
    };
    let _ = format!("{g:?}");
    let mut w = GgufWriter::new();
    for (key, value) in g.metadata().iter() {
        let _ = value.summary(8);
        let _ = value.to_string();
        assert!(g.get(key).is_ok());
        let _ = g.get_usize(key);
        let _ = g.get_str(key);
        let _ = g.get_str_array(key);
        let _ = g.get_f32_array(key);
        w.add_metadata(key, value.clone()).expect("a parsed entry is writable");
    }
    for t in g.tensors() {
        let bytes = g.tensor_data(t.name()).expect("listed tensor");
        assert_eq!(bytes.len(), t.n_bytes());
        match g.load_tensor(t.name()).expect("listed tensor") {
            LoadedTensor::Dense(x) => assert_eq!(x.numel(), t.numel()),
            LoadedTensor::Raw { bytes: b, .. } => assert_eq!(b.len(), t.n_bytes()),
        }
        w.add_tensor_bytes(t.name(), t.qtype(), &t.shape(), bytes)
            .expect("a parsed tensor is writable");
    }
    // What was read writes back and reads again to the same content. A
    // huge alignment (up to 2^31) legitimately writes that much padding, so
    // the rewrite is skipped there to stay within the fuzzer's memory limit.
    if g.alignment() > 1 << 16 {
        return;
    }
    let again = Gguf::from_vec(w.to_bytes()).expect("rewritten file parses");
    assert_eq!(again.metadata().len(), g.metadata().len());
    assert_eq!(again.tensors().len(), g.tensors().len());
    for (a, b) in again.tensors().iter().zip(g.tensors()) {
        assert_eq!(a.dims(), b.dims());
        assert_eq!(again.data_of(a), g.data_of(b));
    }
});
