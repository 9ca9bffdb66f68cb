//! File-level quantization: a whole GGUF model to a llama.cpp file type,
//! byte for byte as `llama-quantize` writes it (without an importance
//! matrix).
//!
//! [`mix::choose_types`] picks each tensor's type; this module plans the
//! conversion, refuses what llama-quantize refuses, converts the tensors
//! (through f32, as llama.cpp's `llama_model_quantize_impl` does) and
//! builds the output file: the input's metadata in its order without the
//! keys llama.cpp drops, then `general.quantization_version` and
//! `general.file_type`, then the tensors in llama.cpp's order.
//!
//! ```no_run
//! use rustorch_core::gguf::Gguf;
//! use rustorch_quantize::file::{quantize_gguf, QuantizeOptions};
//! use rustorch_quantize::mix::FileType;
//! let g = Gguf::open("model-f16.gguf")?;
//! let out = quantize_gguf(&g, FileType::Q4KM, &QuantizeOptions::default(), |_| {})?;
//! out.writer.write_file("model-q4_k_m.gguf")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::mix::{self, FileType, MixError, MixOptions, ModelParams, TensorDesc, TypeChoice};
use rustorch_core::gguf::{Gguf, GgufError, GgufWriter, TensorInfo, Value};
use rustorch_core::quant::{QType, QuantError};
use std::borrow::Cow;

/// Keys llama.cpp drops or rewrites: the quantization keys are set anew
/// (appended last, as `gguf_set_val_u32` does), split keys are removed
/// (`llama_model_quantize_impl`, src/llama-quant.cpp).
const DROPPED_KEYS: [&str; 5] = [
    "general.quantization_version",
    "general.file_type",
    "split.no",
    "split.count",
    "split.tensors.count",
];

/// The options of `llama_model_quantize_params` this module honours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// Options that change the per-tensor types (`--pure`,
    /// `--leave-output-tensor`, ...).
    pub mix: MixOptions,
    /// `--allow-requantize`: convert tensors that are already quantized
    /// (dequantized to f32 first, as llama-quantize does). Off by default,
    /// as in llama-quantize, because quantizing twice loses more than
    /// quantizing once from the original weights.
    pub allow_requantize: bool,
}

/// Why a model could not be quantized. Each variant names the tensor.
#[derive(Debug, thiserror::Error)]
pub enum FileQuantError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("{0}")]
    Mix(#[from] MixError),
    #[error("tensor {name}: {source}")]
    Quant {
        name: String,
        #[source]
        source: QuantError,
    },
    #[error("no general.architecture in the metadata; is this a model?")]
    NoArchitecture,
    #[error("metadata key {key} is {found}, expected a non-negative integer")]
    BadCount { key: String, found: String },
    #[error(
        "the model is already quantized ({name} is {from}); requantizing from {from} is disabled \
         (allow it with allow_requantize / --allow-requantize, or quantize from an F32, F16 or BF16 model)"
    )]
    Requantize { name: String, from: QType },
    #[error("tensor {name} is {from}, which cannot be converted to {to}")]
    Unconvertible { name: String, from: QType, to: QType },
    #[error("tensor {name} would need type {to}, which this library cannot quantize to")]
    CannotQuantize { name: String, to: QType },
}

/// One tensor of the plan: where it comes from and the type it gets.
#[derive(Clone, Copy, Debug)]
pub struct PlannedTensor<'g> {
    pub info: &'g TensorInfo,
    pub choice: TypeChoice,
}

impl PlannedTensor<'_> {
    /// Whether the bytes change (otherwise they are copied as they are).
    pub fn converts(&self) -> bool {
        self.choice.qtype != self.info.qtype()
    }
}

/// Progress after each tensor, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// The tensor just written.
    pub tensor: &'a PlannedTensor<'a>,
    /// Elements done so far, this tensor included.
    pub done: u64,
    /// Elements in all tensors.
    pub total: u64,
}

/// The quantized model, ready to write (unchanged tensors borrow the
/// input's bytes).
pub struct QuantizedGguf<'g> {
    pub ftype: FileType,
    /// Every tensor with its type, in the output order.
    pub plan: Vec<PlannedTensor<'g>>,
    pub writer: GgufWriter<'g>,
}

/// The hyperparameters the mix rules read, from `{arch}.*` metadata.
pub fn model_params(g: &Gguf) -> Result<ModelParams, FileQuantError> {
    let arch = g
        .get_str("general.architecture")
        .map_err(|_| FileQuantError::NoArchitecture)?
        .to_string();
    let n_layer = g.get_usize(&format!("{arch}.block_count"))?;
    let n_head = first_usize(g, &format!("{arch}.attention.head_count"))?.unwrap_or(0);
    let n_head_kv = first_usize(g, &format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head);
    let n_expert = first_usize(g, &format!("{arch}.expert_count"))?.unwrap_or(0);
    Ok(ModelParams {
        arch,
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
    })
}

/// A count stored as any integer, or per layer as an array (then layer
/// 0's, as llama.cpp's `n_gqa()` reads it). `None` when absent.
fn first_usize(g: &Gguf, key: &str) -> Result<Option<usize>, FileQuantError> {
    let Ok(v) = g.get(key) else {
        return Ok(None);
    };
    let first = match v {
        Value::Array(a) => a.get(0),
        v => Some(v.clone()),
    };
    match first.as_ref().and_then(Value::as_u64_lossless) {
        Some(x) => usize::try_from(x).map(Some).map_err(|_| FileQuantError::BadCount {
            key: key.to_string(),
            found: format!("{x}"),
        }),
        None => Err(FileQuantError::BadCount {
            key: key.to_string(),
            found: v.type_desc().to_string(),
        }),
    }
}

/// Every tensor with the type it gets, in the order llama.cpp writes them,
/// after checking that every conversion is possible.
pub fn plan<'g>(
    g: &'g Gguf,
    ftype: FileType,
    opts: &QuantizeOptions,
) -> Result<Vec<PlannedTensor<'g>>, FileQuantError> {
    let params = model_params(g)?;
    let descs: Vec<TensorDesc<'_>> = g
        .tensors()
        .iter()
        .map(|t| TensorDesc {
            name: t.name(),
            dims: t.dims(),
            qtype: t.qtype(),
        })
        .collect();
    let choices = mix::choose_types(ftype, &params, &descs, &opts.mix)?;
    let mut plan: Vec<PlannedTensor<'g>> = g
        .tensors()
        .iter()
        .zip(choices)
        .map(|(info, choice)| PlannedTensor { info, choice })
        .collect();
    plan.sort_by(|a, b| mix::llama_order(a.info.name(), b.info.name()));
    for p in &plan {
        if !p.converts() {
            continue;
        }
        let (name, from, to) = (p.info.name().to_string(), p.info.qtype(), p.choice.qtype);
        // llama-quantize refuses quantized inputs unless asked
        // (`requantizing from type %s is disabled`).
        if from.is_quantized() && !opts.allow_requantize {
            return Err(FileQuantError::Requantize { name, from });
        }
        // llama_tensor_dequantize_impl converts F16, BF16 and quantized
        // types; F32 is used as it is.
        if !(from == QType::F32 || rustorch_core::quant::can_dequantize(from)) {
            return Err(FileQuantError::Unconvertible { name, from, to });
        }
        if !rustorch_core::quant::can_quantize(to) {
            return Err(FileQuantError::CannotQuantize { name, to });
        }
    }
    Ok(plan)
}

/// Quantizes `g` to `ftype` as `llama-quantize [--allow-requantize] IN OUT
/// FTYPE` does. `progress` is called after each tensor. Work runs on the
/// current rayon pool (the quantizers split large tensors into tasks).
pub fn quantize_gguf<'g>(
    g: &'g Gguf,
    ftype: FileType,
    opts: &QuantizeOptions,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<QuantizedGguf<'g>, FileQuantError> {
    let plan = plan(g, ftype, opts)?;
    let mut w = GgufWriter::new();
    for (key, value) in g.metadata().iter() {
        if !DROPPED_KEYS.contains(&key) {
            w.add_metadata(key, value.clone())?;
        }
    }
    w.add_metadata("general.quantization_version", Value::U32(mix::QUANTIZATION_VERSION))?;
    w.add_metadata("general.file_type", Value::U32(ftype.id()))?;

    let total: u64 = plan.iter().map(|p| p.info.numel() as u64).sum();
    let mut done = 0u64;
    for p in &plan {
        let src = g.data_of(p.info);
        let data: Cow<'g, [u8]> = if p.converts() {
            Cow::Owned(convert(p.info, src, p.choice.qtype)?)
        } else {
            // Same type: llama-quantize copies the bytes.
            Cow::Borrowed(src)
        };
        w.add_tensor_bytes(p.info.name(), p.choice.qtype, &p.info.shape(), data)?;
        done += p.info.numel() as u64;
        progress(Progress { tensor: p, done, total });
    }
    Ok(QuantizedGguf { ftype, plan, writer: w })
}

/// A tensor's bytes to `to`, through f32 as llama.cpp does (its
/// `llama_tensor_dequantize_impl` uses each type's reference `to_float`,
/// which `quant::dequantize` reproduces bit for bit). Rows are whole blocks
/// of `to` (the mix's fallback sees to it), so the tensor can be quantized
/// as one run of blocks.
fn convert(info: &TensorInfo, src: &[u8], to: QType) -> Result<Vec<u8>, FileQuantError> {
    let err = |source| FileQuantError::Quant {
        name: info.name().to_string(),
        source,
    };
    let n = info.numel();
    let f32s: Cow<'_, [f32]> = match info.qtype() {
        QType::F32 => {
            let (chunks, _) = src.as_chunks::<4>();
            Cow::Owned(chunks.iter().map(|c| f32::from_le_bytes(*c)).collect())
        }
        from => Cow::Owned(rustorch_core::quant::dequantize(from, src, n).map_err(err)?),
    };
    mix::quantize_like_llama_cpp(to, &f32s).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-layer llama model: a Q4_0 attention weight of 2 rows x 64 and
    /// an F32 norm, from deterministic values.
    fn tiny_model() -> (Vec<u8>, Vec<f32>) {
        let w: Vec<f32> = (0..128).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let q = rustorch_core::quant::quantize(QType::Q4_0, &w).expect("64-element rows are whole Q4_0 blocks");
        let mut gw = GgufWriter::new();
        gw.add_metadata("general.architecture", Value::String("llama".into()))
            .unwrap();
        gw.add_metadata("llama.block_count", Value::U32(1)).unwrap();
        gw.add_metadata("general.file_type", Value::U32(2)).unwrap();
        gw.add_tensor_bytes("blk.0.attn_q.weight", QType::Q4_0, &[2, 64], q)
            .unwrap();
        let norm: Vec<u8> = [1.0f32; 64].iter().flat_map(|x| x.to_le_bytes()).collect();
        gw.add_tensor_bytes("blk.0.attn_norm.weight", QType::F32, &[64], norm)
            .unwrap();
        (gw.to_bytes(), w)
    }

    #[test]
    fn quantized_input_is_refused_unless_allowed() {
        let (bytes, _) = tiny_model();
        let g = Gguf::from_bytes(&bytes).unwrap();
        let err = quantize_gguf(&g, FileType::Q8_0, &QuantizeOptions::default(), |_| {})
            .err()
            .expect("requantizing is off by default");
        assert!(
            matches!(&err, FileQuantError::Requantize { name, from: QType::Q4_0 } if name == "blk.0.attn_q.weight"),
            "{err}"
        );
        assert!(err.to_string().contains("allow_requantize"), "{err}");
    }

    #[test]
    fn requantizing_goes_through_f32() {
        let (bytes, _) = tiny_model();
        let g = Gguf::from_bytes(&bytes).unwrap();
        let opts = QuantizeOptions {
            allow_requantize: true,
            ..QuantizeOptions::default()
        };
        let mut seen = Vec::new();
        let out = quantize_gguf(&g, FileType::Q8_0, &opts, |p| seen.push((p.done, p.total))).unwrap();
        assert_eq!(
            seen,
            [(64, 192), (192, 192)],
            "one report per tensor, in llama.cpp's order"
        );
        let written = Gguf::from_vec(out.writer.to_bytes()).unwrap();
        assert_eq!(written.get_u32("general.file_type").unwrap(), FileType::Q8_0.id());
        assert_eq!(
            written.get_u32("general.quantization_version").unwrap(),
            mix::QUANTIZATION_VERSION
        );
        // The reference: dequantize the Q4_0 bytes, quantize the f32 values to Q8_0.
        let src = g.tensor_data("blk.0.attn_q.weight").unwrap();
        let f = rustorch_core::quant::dequantize(QType::Q4_0, src, 128).unwrap();
        let want = rustorch_core::quant::quantize(QType::Q8_0, &f).unwrap();
        let t = written.tensor_info("blk.0.attn_q.weight").unwrap();
        assert_eq!(t.qtype(), QType::Q8_0);
        assert_eq!(written.data_of(t), &want[..]);
        // Norms keep their type and bytes.
        assert_eq!(
            written.tensor_data("blk.0.attn_norm.weight").unwrap(),
            g.tensor_data("blk.0.attn_norm.weight").unwrap()
        );
    }
}
