use rustorch_core::{DType, Tensor};
use rustorch_core::op::AttnMask;
fn main() {
    let which = std::env::args().nth(1).unwrap();
    let iters: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    match which.as_str() {
        "prefill" => {
            let q = Tensor::randn([1, 16, 256, 64], DType::F32, 1).unwrap();
            let k = Tensor::randn([1, 4, 256, 64], DType::F32, 2).unwrap();
            let v = Tensor::randn([1, 4, 256, 64], DType::F32, 3).unwrap();
            for _ in 0..iters { std::hint::black_box(Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::Causal, None, None).unwrap()); }
        }
        "decode" => {
            let q = Tensor::randn([1, 32, 1, 128], DType::F32, 1).unwrap();
            let k = Tensor::randn([1, 8, 2048, 128], DType::F32, 2).unwrap();
            let v = Tensor::randn([1, 8, 2048, 128], DType::F32, 3).unwrap();
            for _ in 0..iters { std::hint::black_box(Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::CausalFromEnd, None, None).unwrap()); }
        }
        "setup" => {
            let _q = Tensor::randn([1, 32, 1, 128], DType::F32, 1).unwrap();
            let _k = Tensor::randn([1, 8, 2048, 128], DType::F32, 2).unwrap();
            let _v = Tensor::randn([1, 8, 2048, 128], DType::F32, 3).unwrap();
        }
        "layer_norm" | "rms_norm" => {
            let x = Tensor::randn([512, 2048], DType::F32, 1).unwrap();
            for _ in 0..iters { std::hint::black_box(if which == "rms_norm" { x.rms_norm(None, 1e-5) } else { x.layer_norm(1, None, None, 1e-5) }.unwrap()); }
        }
        _ => panic!(),
    }
}
