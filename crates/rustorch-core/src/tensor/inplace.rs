//! In-place writes (the one mutable corner of the tensor API).

use super::Tensor;
use crate::error::{Error, Result};
use crate::op::{Op, RopeLayout};

impl Tensor {
    /// Writes `src` into this tensor at `start` along `dim` (the region
    /// `self.narrow(dim, start, src.size(dim))`), in place, like PyTorch's
    /// `self.narrow(dim, start, n).copy_(src)`: a source of another dtype is
    /// converted as `src.to_dtype(self.dtype())` would convert it.
    ///
    /// The storage must belong to this tensor alone: views and clones share
    /// storage, and a write must not change what they see, so a shared
    /// storage gives an error instead. This is how a KV cache grows without
    /// copying itself on every token.
    pub fn write_slice(&mut self, dim: isize, start: usize, src: &Tensor) -> Result<()> {
        let d = self.shape().dim("write_slice", dim)?;
        if src.rank() != self.rank() {
            return Err(Error::shape(
                "write_slice",
                "source and destination ranks differ",
                &[self.shape(), src.shape()],
            ));
        }
        let region = self.layout.narrow("write_slice", d as isize, start, src.dims()[d])?;
        let exec = self.exec.clone();
        exec.write_into(&mut self.buffer, &region, &src.operand())
    }

    /// `write_slice(dim, start, src)` with `start` the value of `pos` (one
    /// i32 or i64 element, shape `[1]` or `[]`) read when the write runs,
    /// by the device that holds this tensor: on a GPU the kernel reads it,
    /// with no synchronization with the host.
    ///
    /// This exists for CUDA graphs: a captured decode step replays its
    /// kernels with the arguments they were captured with, so the KV
    /// cache's write position, which moves one token per step, cannot be
    /// a host number in the launch. Keeping it in a device tensor that the
    /// caller updates between replays lets the same graph write each new
    /// token where it belongs.
    ///
    /// `pos` must lie in `0..=self.size(dim) - src.size(dim)`; any other
    /// value is an error and writes nothing. Sharing rules, dtype
    /// conversion and shape checks are `write_slice`'s. A backend without
    /// its own position-reading write falls back to reading `pos` on the
    /// host (`Executor::write_into_at`).
    pub fn write_slice_at(&mut self, dim: isize, pos: &Tensor, src: &Tensor) -> Result<()> {
        const OP: &str = "write_slice_at";
        let d = self.shape().dim(OP, dim)?;
        if src.rank() != self.rank() {
            return Err(Error::shape(
                OP,
                "source and destination ranks differ",
                &[self.shape(), src.shape()],
            ));
        }
        let (size, len) = (self.dims()[d], src.dims()[d]);
        // The region at position 0; `narrow` rejects a source longer than
        // the destination along `dim`, so `max_pos` cannot underflow below.
        let region = self.layout.narrow(OP, d as isize, 0, len)?;
        let max_pos = size - len;
        let step = self.layout.strides()[d];
        let exec = self.exec.clone();
        exec.write_into_at(&mut self.buffer, &region, step, max_pos, &pos.operand(), &src.operand())
    }

    /// A decode step's attention inputs: returns `q.rope(cos, sin, layout)`
    /// and writes `k.rope(cos, sin, layout)` into `kc` and `v` into `vc`
    /// along `dim` at the position `pos` holds, as `write_slice_at` writes
    /// them, with the same values. A backend that fuses it (CUDA: one
    /// launch instead of two RoPE launches and two cache writes) does it in
    /// one call where everything is on its device; otherwise the ops run
    /// one by one.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_write_kv_at(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (cos, sin, layout): (&Tensor, &Tensor, RopeLayout),
        kc: &mut Tensor,
        vc: &mut Tensor,
        dim: isize,
        pos: &Tensor,
    ) -> Result<Tensor> {
        const OP: &str = "rope_write_kv_at";
        let fused = (|| -> Result<Option<Tensor>> {
            let d = kc.shape().dim(OP, dim)?;
            if vc.shape().dim(OP, dim)? != d || k.rank() != kc.rank() || v.rank() != vc.rank() {
                return Ok(None);
            }
            let (n, len) = (kc.dims()[d], k.dims()[d]);
            if vc.dims()[d] != n || v.dims()[d] != len || len > n {
                return Ok(None);
            }
            // Shapes and dtypes as the ops one by one would check them.
            let meta = |t: &Tensor| crate::op::TensorMeta::new(t.shape().clone(), t.dtype());
            let rope = Op::Rope { layout };
            let q_out = crate::op::infer_outputs(&rope, &[meta(q), meta(cos), meta(sin)])?;
            crate::op::infer_outputs(&rope, &[meta(k), meta(cos), meta(sin)])?;
            let k_region = kc.layout.narrow(OP, d as isize, 0, len)?;
            let v_region = vc.layout.narrow(OP, d as isize, 0, len)?;
            if k_region.shape() != k.shape() || v_region.shape() != v.shape() {
                return Ok(None);
            }
            let (k_step, v_step) = (kc.layout.strides()[d], vc.layout.strides()[d]);
            let exec = kc.exec.clone();
            let out = exec.rope_write_kv_at(
                &mut kc.buffer,
                &mut vc.buffer,
                (&k_region, k_step),
                (&v_region, v_step),
                n - len,
                &pos.operand(),
                layout,
                [&q.operand(), &k.operand(), &v.operand()],
                [&cos.operand(), &sin.operand()],
            )?;
            Ok(out.zip(q_out.into_iter().next()).map(|(buf, meta)| {
                Tensor::from_parts(buf, crate::layout::Layout::contiguous(meta.shape), q.exec.clone())
            }))
        })()?;
        if let Some(q) = fused {
            return Ok(q);
        }
        let q = q.rope(cos, sin, layout)?;
        let k = k.rope(cos, sin, layout)?;
        kc.write_slice_at(dim, pos, &k)?;
        vc.write_slice_at(dim, pos, v)?;
        Ok(q)
    }

    /// A decode step's attention with its inputs' RoPE and cache write, in
    /// one call where the caches' backend fuses them (CUDA, with
    /// unless `RUSTORCH_CUDA_ROPE_ATTENTION=0`: one launch): what
    /// `rope_write_kv_at(q, k, v, (cos, sin, layout), kc, vc, dim, pos)`
    /// with `cos` and `sin` the rows of `cos_table` and `sin_table`
    /// (`[rows, R/2]`) at the position `pos` holds, then
    /// `attention_at(q, kc, vc, pos, scale, window)` compute, with the same
    /// values. `None`, with nothing written: not fused here (the caller
    /// runs those ops).
    #[allow(clippy::too_many_arguments)]
    pub fn try_rope_attention_at(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (cos_table, sin_table, layout): (&Tensor, &Tensor, RopeLayout),
        kc: &mut Tensor,
        vc: &mut Tensor,
        dim: isize,
        pos: &Tensor,
        (scale, window): (f32, Option<usize>),
    ) -> Result<Option<Tensor>> {
        const OP: &str = "rope_attention_at";
        let d = kc.shape().dim(OP, dim)?;
        if vc.shape().dim(OP, dim)? != d || k.rank() != kc.rank() || v.rank() != vc.rank() || cos_table.rank() != 2 {
            return Ok(None);
        }
        let (n, len) = (kc.dims()[d], k.dims()[d]);
        if vc.dims()[d] != n || v.dims()[d] != len || len > n || sin_table.dims() != cos_table.dims() {
            return Ok(None);
        }
        // Shapes and dtypes as the ops one by one would check them (the
        // rotation with one row of the tables).
        let meta = |t: &Tensor| crate::op::TensorMeta::new(t.shape().clone(), t.dtype());
        let row = crate::op::TensorMeta::new(vec![1, cos_table.dims()[1]], cos_table.dtype());
        let rope = Op::Rope { layout };
        let q_meta = crate::op::infer_outputs(&rope, &[meta(q), row.clone(), row.clone()])?;
        crate::op::infer_outputs(&rope, &[meta(k), row.clone(), row])?;
        let attention = Op::AttentionAt { scale, window };
        let out = crate::op::infer_outputs(&attention, &[q_meta[0].clone(), meta(kc), meta(vc), meta(pos)])?;
        let k_region = kc.layout.narrow(OP, d as isize, 0, len)?;
        let v_region = vc.layout.narrow(OP, d as isize, 0, len)?;
        if k_region.shape() != k.shape() || v_region.shape() != v.shape() {
            return Ok(None);
        }
        let (k_step, v_step) = (kc.layout.strides()[d], vc.layout.strides()[d]);
        let (k_layout, v_layout) = (kc.layout.clone(), vc.layout.clone());
        let exec = kc.exec.clone();
        let buf = exec.rope_attention_at(
            (&mut kc.buffer, &mut vc.buffer),
            [&k_layout, &v_layout],
            ((&k_region, k_step), (&v_region, v_step), n - len),
            &pos.operand(),
            layout,
            [&q.operand(), &k.operand(), &v.operand()],
            [&cos_table.operand(), &sin_table.operand()],
            (scale, window),
        )?;
        Ok(buf
            .zip(out.into_iter().next())
            .map(|(buf, meta)| Tensor::from_parts(buf, crate::layout::Layout::contiguous(meta.shape), q.exec.clone())))
    }
}
