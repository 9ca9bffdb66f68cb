//! In-place writes into a region of a host buffer (`Backend::write_into`).

use super::copy::{cast, contiguous};
use super::{CpuInput, CpuStorage, StorageElement};
use rustorch_core::backend::{check_write_at, write_pos_on_host, TensorRef};
use rustorch_core::error::BackendError;
use rustorch_core::layout::{Layout, StridedBlocks};

const OP: &str = "write_into";

/// Copies `src` (read through `src_layout`) into the elements of `dst` that
/// `region` selects. Shapes must agree; a source of another dtype is
/// converted on the way, exactly as the cast op (`Tensor::to_dtype`) would
/// convert it: a KV cache write of f32 keys into an f16 cache is one op,
/// not a cast and a write (per-op cost is a tenth of a decode step).
pub fn write_into(
    dst: &mut CpuStorage,
    region: &Layout,
    src: &CpuStorage,
    src_layout: &Layout,
) -> Result<(), BackendError> {
    if region.shape() != src_layout.shape() {
        return Err(BackendError::invalid(
            OP,
            format!(
                "region {:?} and source {:?} differ in shape",
                region.dims(),
                src_layout.dims()
            ),
        ));
    }
    if region.storage_extent() > dst.len() || src_layout.storage_extent() > src.len() {
        return Err(BackendError::invalid(OP, "layout reaches past the end of its storage"));
    }
    if dst.dtype() != src.dtype() {
        // The cast op's conversion, then the same-dtype write of its
        // (contiguous) result.
        let converted = cast(
            CpuInput {
                storage: src,
                layout: src_layout,
            },
            dst.dtype(),
        );
        return write_into(dst, region, &converted, &Layout::contiguous(src_layout.shape().clone()));
    }
    rustorch_core::with_cpu_storage!(src, s, T => {
        let d = <T as StorageElement>::slice_mut(dst).expect("dtypes checked equal above");
        copy_region(d, region, &contiguous(s, src_layout));
    });
    Ok(())
}

/// `write_into` at `region` moved by `pos * step` elements, `pos` read
/// here from host memory (`Backend::write_into_at`). A position outside
/// `0..=max_pos`, or a region that could leave `dst` at `max_pos`, is
/// `InvalidInput` before anything is written.
pub fn write_into_at(
    dst: &mut CpuStorage,
    region: &Layout,
    step: usize,
    max_pos: usize,
    pos: (&CpuStorage, &Layout),
    src: &CpuStorage,
    src_layout: &Layout,
) -> Result<(), BackendError> {
    const OP_AT: &str = "write_into_at";
    let pos_ref = TensorRef {
        buffer: pos.0,
        layout: pos.1,
    };
    check_write_at(dst.len(), region, step, max_pos, pos_ref).map_err(|m| BackendError::invalid(OP_AT, m))?;
    let at = write_pos_on_host(pos.0, pos.1, max_pos).map_err(|m| BackendError::invalid(OP_AT, m))?;
    write_into(dst, &region.shifted(at * step), src, src_layout)
}

/// Writes `values` (row-major) into the run structure of `region`.
fn copy_region<T: Copy>(dst: &mut [T], region: &Layout, values: &[T]) {
    match region.blocks() {
        StridedBlocks::Single { start, len } => dst[start..start + len].copy_from_slice(values),
        StridedBlocks::Multiple { starts, run_len } => {
            for (s, chunk) in starts.zip(values.chunks_exact(run_len.max(1))) {
                dst[s..s + run_len].copy_from_slice(chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::CpuBackend;
    use rustorch_core::backend::{Backend, TensorRef};
    use rustorch_core::error::BackendError;
    use rustorch_core::layout::Layout;
    use rustorch_core::storage::CpuStorage;

    /// `Backend::write_into_at` on a [4, 3] f32 destination, rows `pos..pos+2`
    /// from a [2, 3] f32 source; `pos` is element `at` of `pos_data`.
    fn write_rows(dst: &mut CpuStorage, pos_data: &CpuStorage, at: usize, max_pos: usize) -> Result<(), BackendError> {
        let region = Layout::contiguous([2, 3]);
        let src = CpuStorage::from_vec((1..=6).map(|i| i as f32).collect::<Vec<_>>());
        let src_layout = Layout::contiguous([2, 3]);
        let pos_layout = Layout::contiguous_with_offset([1], at);
        CpuBackend::new().write_into_at(
            dst,
            &region,
            3,
            max_pos,
            TensorRef {
                buffer: pos_data,
                layout: &pos_layout,
            },
            TensorRef {
                buffer: &src,
                layout: &src_layout,
            },
        )
    }

    #[test]
    fn writes_at_the_position_it_reads() {
        // (positions, which one is read, its value): an i32 read at an
        // offset past other values, and an i64.
        for (pos, at, p) in [
            (CpuStorage::from_vec(vec![9i32, 9, 2]), 2, 2),
            (CpuStorage::from_vec(vec![1i64]), 0, 1),
        ] {
            let mut dst = CpuStorage::zeros(rustorch_core::DType::F32, 12);
            write_rows(&mut dst, &pos, at, 2).unwrap();
            let mut want = [0f32; 12];
            for (i, w) in want[p * 3..p * 3 + 6].iter_mut().enumerate() {
                *w = (i + 1) as f32;
            }
            assert_eq!(dst.as_slice::<f32>().unwrap(), &want[..], "position {p}");
        }
    }

    #[test]
    fn bad_positions_and_bounds_write_nothing() {
        let cases = [
            (CpuStorage::from_vec(vec![-1i32]), 2, "outside 0..=2"),
            (CpuStorage::from_vec(vec![3i64]), 2, "outside 0..=2"),
            (CpuStorage::from_vec(vec![i64::MIN]), 2, "outside 0..=2"),
            (CpuStorage::from_vec(vec![0f32]), 2, "i32 or i64"),
            // Three steps of 3 from a 6-element region pass the 12 elements.
            (CpuStorage::from_vec(vec![0i64]), 3, "reaches past"),
        ];
        for (pos, max_pos, why) in cases {
            let mut dst = CpuStorage::from_vec(vec![7f32; 12]);
            let err = write_rows(&mut dst, &pos, 0, max_pos).unwrap_err();
            assert!(
                matches!(&err, BackendError::InvalidInput { message, .. } if message.contains(why)),
                "{pos:?}: {err}"
            );
            assert_eq!(dst.as_slice::<f32>().unwrap(), &[7f32; 12][..]);
        }
    }
}
