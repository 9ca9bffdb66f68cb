//! The transfer study: host -> GPU and GPU -> host copies of 4 KiB to
//! 1 GiB from ordinary (pageable) host memory, by each method of
//! `rustorch_cuda::transfer` (the driver's pageable copy, our pinned
//! double-buffered staging, mapped memory read by a copy kernel), and by
//! the method the backend picks for the size (`auto`, what `upload` and
//! `download` use). One line per case:
//! `direction size method GB/s`, the median of several runs, each ended by
//! a synchronization. bench/device_cuda.sh prints them as a table.
//!
//! cargo run --release -p rustorch-cuda --example cuda_transfers

use rustorch_core::{Backend, DType};
use rustorch_cuda::transfer::{Direction, Method};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let b = rustorch_cuda::CudaBackend::new(0)?;
    let sizes: [usize; 7] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 256 << 20, 1 << 30];
    for &size in &sizes {
        let reps = if size >= 256 << 20 { 5 } else { 20 };
        // Distinct bytes, so that a copy that moved nothing would show.
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let mut back = vec![0u8; size];
        for method in Method::ALL.into_iter().map(Some).chain([None]) {
            let label = method.map_or("auto", Method::name);
            let up_method = method.unwrap_or(Method::for_size(Direction::Upload, size));
            let down_method = method.unwrap_or(Method::for_size(Direction::Download, size));
            let upload = || b.upload_with(up_method, DType::U8, &src);
            let mut up = Vec::new();
            let mut kept = None;
            for i in 0..reps + 2 {
                let t = Instant::now();
                let buf = upload()?;
                b.synchronize()?;
                if i >= 2 {
                    up.push(t.elapsed().as_secs_f64());
                }
                kept = Some(buf);
            }
            let buf = kept.ok_or("no upload")?;
            let mut down = Vec::new();
            for i in 0..reps + 2 {
                back.iter_mut().for_each(|x| *x = 0);
                let t = Instant::now();
                b.download_with(down_method, &buf, &mut back)?;
                if i >= 2 {
                    down.push(t.elapsed().as_secs_f64());
                }
            }
            if back != src {
                return Err(format!("{label} {size}: the bytes that came back differ").into());
            }
            let gbs = |secs: f64| size as f64 / secs / 1e9;
            println!("transfer up {size} {label} {:.2}", gbs(median(up)));
            println!("transfer down {size} {label} {:.2}", gbs(median(down)));
        }
    }
    Ok(())
}
