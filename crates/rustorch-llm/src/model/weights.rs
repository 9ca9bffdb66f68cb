//! Model weights read from a GGUF file into tensors.
//!
//! Matrices stay in their GGML type (`QWeight`, raw blocks that the
//! quantized matmul reads in place); norm vectors become f32 tensors. The
//! bytes are copied out of the file once, so the memory map can be dropped
//! after loading and memory use is the model's size.

use super::config::{Arch, ModelConfig};
use crate::error::{LlmError, Result};
use rustorch::gguf::{Gguf, TensorInfo};
use rustorch::quant;
use rustorch::{DType, Device, Executor, Op, QWeight, Tensor, TensorMeta};
use std::sync::Arc;

/// Which device holds each part of a model: what llama.cpp's
/// `--gpu-layers N` decides (the last N layers on the GPU, the output too
/// when N exceeds the layer count). The token embedding stays on the host,
/// as llama.cpp keeps it: a lookup reads a few rows, and the executor moves
/// them to the first layer's device. Each layer's KV cache lives with the
/// layer (`Model::new_cache`); activations move between devices once per
/// boundary, by the executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// One device per layer.
    pub layers: Vec<Device>,
    /// The output norm and projection.
    pub output: Device,
}

impl Placement {
    /// Every part on `device`.
    pub fn all_on(device: Device, n_layer: usize) -> Placement {
        Placement {
            layers: vec![device; n_layer],
            output: device,
        }
    }

    /// llama.cpp's `-ngl n` with `device` for the offloaded part: the last
    /// `n` of `n_layer` layers, and the output when `n > n_layer`; the rest
    /// on the CPU.
    pub fn offload(device: Device, n: usize, n_layer: usize) -> Placement {
        let first = n_layer.saturating_sub(n);
        Placement {
            layers: (0..n_layer)
                .map(|il| if il >= first { device } else { Device::Cpu })
                .collect(),
            output: if n > n_layer { device } else { Device::Cpu },
        }
    }

    /// The number of layers on a device other than the CPU.
    pub fn offloaded_layers(&self) -> usize {
        self.layers.iter().filter(|d| !d.is_cpu()).count()
    }

    /// `-ngl auto`: the `n` for `offload` that fits a device with `free`
    /// bytes: layers from the last backwards while their weights
    /// (`layer_bytes`, one per layer) and KV cache (`kv_bytes` each) fit
    /// after `reserve` bytes are kept free; then the output (`output_bytes`)
    /// when every layer fit and it does too. Never more than fits, so a
    /// model larger than the device loads with fewer layers there.
    pub fn fitting(layer_bytes: &[usize], kv_bytes: usize, output_bytes: usize, free: usize, reserve: usize) -> usize {
        let mut left = free.saturating_sub(reserve);
        let mut n = 0;
        for &w in layer_bytes.iter().rev() {
            let need = w + kv_bytes;
            if need > left {
                return n;
            }
            left -= need;
            n += 1;
        }
        if output_bytes <= left {
            n + 1
        } else {
            n
        }
    }
}

/// One transformer block.
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub wq: QWeight,
    pub wk: QWeight,
    pub wv: QWeight,
    pub wo: QWeight,
    /// Gemma 3: RMS norms over each query / key head.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// Gemma 3: RMS norm of the attention output before the residual add.
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub ffn_gate: QWeight,
    pub ffn_up: QWeight,
    pub ffn_down: QWeight,
    /// Gemma 3: RMS norm of the feed-forward output before the residual add.
    pub post_ffn_norm: Option<Tensor>,
}

pub struct Weights {
    pub tok_embd: QWeight,
    pub output_norm: Tensor,
    /// The output projection; the token embedding again for tied models
    /// (SmolLM2 and Gemma 3 ship no `output.weight`).
    pub output: QWeight,
    /// Whether `output` is the token embedding (the file has no
    /// `output.weight`); a GPU's output then holds its own copy of it.
    pub output_tied: bool,
    /// Llama 3.1 style per-frequency rope divisors (`rope_freqs.weight`).
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
}

struct Loader<'a> {
    g: &'a Gguf,
    exec: &'a Arc<Executor>,
    /// Where the weights being loaded go.
    device: Device,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.g
            .tensor_info(name)
            .map_err(|_| LlmError::MissingTensor(name.to_string()))
    }

    fn has(&self, name: &str) -> bool {
        self.g.tensor_info(name).is_ok()
    }

    /// A matrix `[rows, cols]` in its file type that is only multiplied
    /// (never looked up by row): in the layout its products stream fastest
    /// (`QWeight::for_matmul_in`).
    fn matmul_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QWeight> {
        self.load_matrix(name, rows, cols, true)
    }

    /// A matrix `[rows, cols]` in its file type, row after row (the token
    /// embedding, which is looked up by row and, in tied models, multiplied).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QWeight> {
        self.load_matrix(name, rows, cols, false)
    }

    /// Checks the expected shape and type support, then copies the bytes.
    fn load_matrix(&self, name: &str, rows: usize, cols: usize, matmul_only: bool) -> Result<QWeight> {
        let info = self.info(name)?;
        let shape = info.shape();
        if shape != [rows, cols] {
            return Err(LlmError::BadTensorShape {
                name: name.to_string(),
                expected: vec![rows, cols],
                found: shape,
            });
        }
        let qtype = info.qtype();
        let product = Op::QMatMul {
            qtype,
            cpu: Default::default(),
        };
        let metas = [
            TensorMeta::new([1, cols], DType::F32),
            TensorMeta::new([rows, qtype.bytes_for(cols).unwrap_or(0)], DType::U8),
        ];
        if self.exec.devices_supporting(&product, &metas).is_empty() {
            return Err(LlmError::Unsupported(format!(
                "tensor {name} has type {qtype}, which has no matmul kernels yet"
            )));
        }
        if !self.device.is_cpu() {
            // Straight from the memory map to the device: no host copy.
            let bytes = self.g.data_of(info);
            return Ok(if matmul_only {
                QWeight::for_matmul_on(self.exec, self.device, qtype, rows, cols, bytes)?
            } else {
                QWeight::from_bytes_in(self.exec, qtype, rows, cols, bytes.to_vec())?.to_device(self.device)?
            });
        }
        // The copy is what the model keeps: `copy_out` lets the map's pages
        // go as it copies, so that loading peaks near one copy of the weights
        // rather than two.
        let bytes = self.g.copy_out(info);
        if matmul_only {
            Ok(QWeight::for_matmul_in(self.exec, qtype, rows, cols, bytes)?)
        } else {
            Ok(QWeight::from_bytes_in(self.exec, qtype, rows, cols, bytes)?.as_lookup_table())
        }
    }

    /// A vector of `n` values as an f32 tensor (dequantized if stored quantized).
    fn vector(&self, name: &str, n: usize) -> Result<Tensor> {
        let info = self.info(name)?;
        if info.numel() != n || info.shape().len() != 1 {
            return Err(LlmError::BadTensorShape {
                name: name.to_string(),
                expected: vec![n],
                found: info.shape(),
            });
        }
        let values = self.f32_values(info)?;
        Ok(Tensor::from_vec(values, [n])?
            .with_executor(self.exec)?
            .to_device(self.device)?)
    }

    fn f32_values(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        // F32 included: dequantize copies it.
        quant::dequantize(info.qtype(), self.g.data_of(info), info.numel())
            .map_err(|e| LlmError::Unsupported(format!("tensor {} of type {}: {e}", info.name(), info.qtype())))
    }

    fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Tensor>> {
        if self.has(name) {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Weights {
    /// The weights of `g`, each part on its device of `place`.
    pub fn load(
        g: &Gguf,
        cfg: &ModelConfig,
        exec: &Arc<Executor>,
        place: &Placement,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Weights> {
        if place.layers.len() != cfg.n_layer {
            return Err(LlmError::InvalidArgument(format!(
                "the placement names {} layers; the model has {}",
                place.layers.len(),
                cfg.n_layer
            )));
        }
        let host = Loader {
            g,
            exec,
            device: Device::Cpu,
        };
        let at = |device: Device| Loader { g, exec, device };
        let l = &host;
        let e = cfg.n_embd;
        let q_dim = cfg.n_head * cfg.head_dim_k;
        let k_dim = cfg.n_head_kv * cfg.head_dim_k;
        let v_dim = cfg.n_head_kv * cfg.head_dim_v;
        let tok_embd = l.matrix("token_embd.weight", cfg.n_vocab, e)?;
        let out = at(place.output);
        let output_norm = out.vector("output_norm.weight", e)?;
        let output_tied = !l.has("output.weight");
        let output = if !output_tied {
            out.matmul_matrix("output.weight", cfg.n_vocab, e)?
        } else if !place.output.is_cpu() {
            // Tied: the output device gets its own copy for its products
            // (llama.cpp duplicates the tensor the same way).
            out.matmul_matrix("token_embd.weight", cfg.n_vocab, e)?
        } else {
            tok_embd.clone()
        };
        let rope_freqs = if l.has("rope_freqs.weight") {
            let info = l.info("rope_freqs.weight")?;
            if info.numel() != cfg.rope.n_rot / 2 {
                return Err(LlmError::BadTensorShape {
                    name: "rope_freqs.weight".into(),
                    expected: vec![cfg.rope.n_rot / 2],
                    found: info.shape(),
                });
            }
            Some(l.f32_values(info)?)
        } else {
            None
        };
        let gemma = cfg.arch == Arch::Gemma3;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            progress(il, cfg.n_layer);
            let l = &at(place.layers[il]);
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            if l.has(&n("attn_qkv")) {
                return Err(LlmError::Unsupported(format!(
                    "{} (fused QKV weights) is not supported yet",
                    n("attn_qkv")
                )));
            }
            let need_gemma = |name: &str, len: usize| -> Result<Option<Tensor>> {
                if gemma {
                    l.vector(&n(name), len).map(Some)
                } else {
                    l.opt_vector(&n(name), len)
                }
            };
            layers.push(LayerWeights {
                attn_norm: l.vector(&n("attn_norm"), e)?,
                wq: l.matmul_matrix(&n("attn_q"), q_dim, e)?,
                wk: l.matmul_matrix(&n("attn_k"), k_dim, e)?,
                wv: l.matmul_matrix(&n("attn_v"), v_dim, e)?,
                wo: l.matmul_matrix(&n("attn_output"), e, cfg.n_head * cfg.head_dim_v)?,
                q_norm: need_gemma("attn_q_norm", cfg.head_dim_k)?,
                k_norm: need_gemma("attn_k_norm", cfg.head_dim_k)?,
                post_attn_norm: need_gemma("post_attention_norm", e)?,
                ffn_norm: l.vector(&n("ffn_norm"), e)?,
                ffn_gate: l.matmul_matrix(&n("ffn_gate"), cfg.n_ff, e)?,
                ffn_up: l.matmul_matrix(&n("ffn_up"), cfg.n_ff, e)?,
                ffn_down: l.matmul_matrix(&n("ffn_down"), e, cfg.n_ff)?,
                post_ffn_norm: need_gemma("post_ffw_norm", e)?,
            });
        }
        progress(cfg.n_layer, cfg.n_layer);
        Ok(Weights {
            tok_embd,
            output_norm,
            output,
            output_tied,
            rope_freqs,
            layers,
        })
    }

    /// Bytes held by the weights (the tied output counted once).
    pub fn n_bytes(&self) -> usize {
        let mats = |l: &LayerWeights| {
            [&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down]
                .iter()
                .map(|w| w.n_bytes())
                .sum::<usize>()
        };
        let tied = Arc::ptr_eq(self.tok_embd.data().buffer(), self.output.data().buffer());
        self.tok_embd.n_bytes()
            + if tied { 0 } else { self.output.n_bytes() }
            + self.layers.iter().map(mats).sum::<usize>()
    }
}

#[cfg(test)]
mod fitting_tests {
    use super::Placement;

    #[test]
    fn auto_offload_takes_the_last_layers_that_fit_then_the_output() {
        let layers = [10, 10, 10, 10];
        // Everything fits: all layers and the output (n = n_layer + 1).
        assert_eq!(Placement::fitting(&layers, 2, 30, 1000, 100), 5);
        // Room for two layers (2 x 12) after the reserve.
        assert_eq!(Placement::fitting(&layers, 2, 30, 130, 100), 2);
        // All layers but not the output.
        assert_eq!(Placement::fitting(&layers, 2, 30, 150, 100), 4);
        // Less free memory than the reserve: nothing on the device.
        assert_eq!(Placement::fitting(&layers, 2, 30, 50, 100), 0);
    }
}
