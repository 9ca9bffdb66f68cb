use rustorch_core::op::AttnMask;
use rustorch_core::{DType, Tensor};
use std::time::Instant;
fn time(name: &str, iters: usize, f: impl Fn() -> Tensor) {
    for _ in 0..2 { std::hint::black_box(f()); }
    let mut best = f64::MAX;
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("rustorch {name}: best {:.3} ms", best * 1e3);
}
fn main() {
    for (r, c) in [(4096usize, 4096usize), (512, 2048)] {
        let x = Tensor::randn([r, c], DType::F32, 1).unwrap();
        let w = Tensor::randn([c], DType::F32, 2).unwrap();
        let b = Tensor::randn([c], DType::F32, 3).unwrap();
        let it = if r * c > 1 << 20 { 10 } else { 100 };
        time(&format!("rms_norm [{r},{c}]"), it, || x.rms_norm(Some(&w), 1e-6).unwrap());
        time(&format!("layer_norm [{r},{c}]"), it, || x.layer_norm(1, Some(&w), Some(&b), 1e-5).unwrap());
    }
    let q = Tensor::randn([1, 16, 256, 64], DType::F32, 1).unwrap();
    let k = Tensor::randn([1, 4, 256, 64], DType::F32, 2).unwrap();
    let v = Tensor::randn([1, 4, 256, 64], DType::F32, 3).unwrap();
    time("sdpa prefill causal [1,16,256,64] gqa4", 20, || Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::Causal, None, None).unwrap());
    let q = Tensor::randn([1, 32, 1, 128], DType::F32, 1).unwrap();
    let k = Tensor::randn([1, 8, 2048, 128], DType::F32, 2).unwrap();
    let v = Tensor::randn([1, 8, 2048, 128], DType::F32, 3).unwrap();
    time("sdpa decode [1,32,1,128] Tk 2048 gqa", 50, || Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::CausalFromEnd, None, None).unwrap());
    let x = Tensor::randn([1, 32, 512, 128], DType::F32, 1).unwrap();
    let (c, s) = Tensor::rope_cos_sin_seq(512, 128, 1e4, DType::F32).unwrap();
    time("rope neox [1,32,512,128]", 20, || x.rope(&c, &s, rustorch_core::op::RopeLayout::NeoX).unwrap());
    let wt = Tensor::randn([32000, 1024], DType::F32, 1).unwrap();
    let ids = Tensor::from_vec((0..2048i64).map(|i| (i * 7919) % 32000).collect::<Vec<_>>(), [2048]).unwrap();
    time("embedding 2048 x 1024", 20, || wt.embedding(&ids).unwrap());
}
