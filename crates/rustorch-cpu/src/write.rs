//! In-place writes into a region of a host buffer (`Backend::write_into`).

use super::copy::{cast, contiguous};
use super::{CpuInput, CpuStorage, StorageElement};
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
