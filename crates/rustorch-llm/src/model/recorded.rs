//! Decode steps replayed as a recorded pass (a CUDA graph): when a whole
//! model runs on one GPU, a step of one token is a few hundred small
//! kernels whose launches and routing cost the host more than the GPU
//! spends on them. The step is recorded once (`Executor::capture`) and
//! replayed for every later token, which costs the host one small write
//! into mapped memory (the token and its position), one launch and the
//! logits' copy out of mapped memory.
//!
//! A replay cannot take new host values, so everything that changes per
//! token lives in device buffers written before each replay: the token,
//! whose row the step looks up in a copy of the token table on the device
//! (where the table has no device copy, the host looks the row up and
//! writes it beside the token), and the position, which the ops read on
//! the device: the RoPE rows (`index_select` from tables for every
//! position), the KV-cache write (`write_slice_at`) and attention over the
//! cache up to the position (`attention_at`, split over the keys).
//!
//! The first step with a cache runs these ops as they are (sizing the
//! recording's memory and loading every kernel), the second records and
//! replays, the rest replay. A recording belongs to one cache (its buffers'
//! addresses are in it). Anything that cannot be recorded turns recording
//! off for the model with a notice, and steps run op by op as before.
//! Recording is on by default; `RUSTORCH_CUDA_GRAPHS=0` runs every step op
//! by op. On the H200 (bench/device_cuda_llm.sh `graphs`, session 30) the
//! recorded steps gave the op-by-op steps' tokens on SmolLM2 F16 for all 22
//! prompts (top-1 logits within 0.014), and on the quantized files as many
//! divergences from llama.cpp CUDA as llama.cpp's own CPU build has, at
//! 1.5 to 2.3 times the speed.

use super::config::{Arch, RopeParams};
use super::kv_cache::KvCache;
use super::rope;
use super::Model;
use crate::error::{LlmError, Result};
use rustorch::{DType, Device, QWeight, Replay, Tensor};
use std::sync::Mutex;

/// The recorded decode step of one model, and what it needs between steps.
#[derive(Default)]
pub(super) struct RecordedDecode {
    state: Mutex<State>,
    /// The token table where the recording device looks rows up itself
    /// (`Model::device_table`), set up by the first session: `None` where
    /// the host looks them up.
    table: std::sync::OnceLock<Option<QWeight>>,
}

#[derive(Default)]
enum State {
    /// Nothing yet, or a cache that is gone.
    #[default]
    Idle,
    /// Steps with `session`'s cache, recorded once it has sized its memory.
    Running(Box<Session>),
    /// Recording failed or is not possible here: steps run op by op.
    Off,
}

/// One cache's buffers and recording.
struct Session {
    cache_id: u64,
    device: Device,
    inputs: Inputs,
    /// RoPE tables for every position of the cache, per settings:
    /// `[n_alloc, n_rot / 2]` cosines and sines on the GPU.
    tables: Vec<(RopeParams, Tensor, Tensor)>,
    /// Device bytes one step allocates (from the first step's run).
    step_bytes: Option<u64>,
    recorded: Option<Box<dyn Replay>>,
    /// The step's logits `[1, n_vocab]`, written by the step's last kernel
    /// where the host reads them in place (`Tensor::host_readable_in`: a
    /// download of them cost the H200's host ~67 us a step, a tenth of it).
    logits: Tensor,
    /// `RUSTORCH_STEP_TIMES=1`: where the host's time of a replayed step goes.
    times: Option<StepTimes>,
}

/// The host's time in each part of the replayed steps (`RUSTORCH_STEP_TIMES=1`),
/// printed every `STEP_TIMES_EVERY` steps: what the GPU waits for between
/// two recorded steps.
#[derive(Default)]
struct StepTimes {
    steps: u32,
    /// From the previous step's return to this step's call (the caller's sampling).
    between: std::time::Duration,
    /// Token check, embedding row and position written.
    inputs: std::time::Duration,
    /// The replay's launch.
    launch: std::time::Duration,
    /// The wait for the step's end.
    wait: std::time::Duration,
    /// The logits' copy to the host and the cache's advance.
    finish: std::time::Duration,
    last_end: Option<std::time::Instant>,
}

const STEP_TIMES_EVERY: u32 = 128;

impl StepTimes {
    fn wanted() -> Option<StepTimes> {
        matches!(std::env::var("RUSTORCH_STEP_TIMES").as_deref(), Ok("1")).then(StepTimes::default)
    }

    fn add(&mut self, start: std::time::Instant, [inputs, launch, waited]: [std::time::Instant; 3]) {
        let end = std::time::Instant::now();
        if let Some(last) = self.last_end {
            self.between += start - last;
        }
        self.inputs += inputs - start;
        self.launch += launch - inputs;
        self.wait += waited - launch;
        self.finish += end - waited;
        self.last_end = Some(end);
        self.steps += 1;
        if self.steps == STEP_TIMES_EVERY {
            let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / f64::from(self.steps);
            eprintln!(
                "rustorch: {} replayed steps, host us a step: between steps {:.1}, inputs {:.1}, launch {:.1}, wait {:.1}, logits {:.1}",
                self.steps,
                us(self.between),
                us(self.inputs),
                us(self.launch),
                us(self.wait),
                us(self.finish)
            );
            *self = StepTimes {
                last_end: self.last_end,
                ..StepTimes::default()
            };
        }
    }
}

/// A step's per-token inputs: the token and its position, `ids_host`
/// `[2]` (I64), which the host writes in mapped host memory where the
/// device has it (a plain write, no upload or launch between steps: two
/// uploads cost the H200's host ~20 us a step). The step's first kernel
/// copies them into `ids` on the device, at a fixed address where its
/// other kernels read them (one read across the bus a step): the token's
/// row of the table is looked up there where the table is on the device
/// (`Embed::Device`), else the host looks it up and writes it into
/// `x_host` beside the ids (the lookup and its write cost the H200's host
/// ~9 us a step), and the step copies it into `x`.
struct Inputs {
    ids_host: Tensor,
    ids: Tensor,
    embed: Embed,
}

/// Where a step's token row is looked up.
enum Embed {
    /// By the step, in this table on its device.
    Device(QWeight),
    /// By the host, which writes the row into `x_host`; the step copies it
    /// into `x`.
    Host { x_host: Tensor, x: Tensor },
}

/// Headroom over the measured step for the recording's arena, and a floor.
const ARENA_FACTOR: usize = 2;
const ARENA_MIN: usize = 4 << 20;

/// Recording is on unless `RUSTORCH_CUDA_GRAPHS=0` (see the module's comment).
fn graphs_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !matches!(std::env::var("RUSTORCH_CUDA_GRAPHS").as_deref(), Ok("0")))
}

impl Model {
    /// The GPU every part of the model and `cache` lives on, when a decode
    /// step could be recorded there (one device, not the CPU, values stored
    /// as rows, no tracing or profiling, not turned off).
    pub(super) fn recording_device(&self, cache: &KvCache) -> Option<Device> {
        let d = self.placement.output;
        let cfg = self.exec.config();
        let ok = graphs_allowed()
            && !d.is_cpu()
            && self.placement.layers.iter().all(|&l| l == d)
            && (0..self.config.n_layer).all(|il| cache.layer_device(il) == Some(d))
            && cache.flash()
            && !cfg.trace
            && cfg.profile == rustorch::ProfileMode::Off;
        ok.then_some(d)
    }

    /// The logits of one token through a recorded step, or `None` where
    /// steps are not recorded (the caller runs the step op by op).
    pub(super) fn recorded_step(&self, cache: &mut KvCache, token: u32) -> Result<Option<Tensor>> {
        let Some(device) = self.recording_device(cache) else {
            return Ok(None);
        };
        let mut state = self
            .recorded
            .state
            .lock()
            .map_err(|_| LlmError::InvalidArgument("a thread panicked during a decode step".into()))?;
        if matches!(*state, State::Off) {
            return Ok(None);
        }
        let fresh = !matches!(&*state, State::Running(s) if s.cache_id == cache.id() && s.device == device);
        if fresh {
            *state = State::Running(Box::new(self.new_session(cache, device)?));
        }
        let State::Running(session) = &mut *state else {
            unreachable!("set above")
        };
        match self.step_in(session, cache, token) {
            Ok(logits) => Ok(Some(logits)),
            Err(Fail::Step(e)) => Err(e),
            Err(Fail::Record(why)) => {
                eprintln!("rustorch: decode steps run op by op on {device}: recording one failed: {why}");
                *state = State::Off;
                Ok(None)
            }
        }
    }

    fn new_session(&self, cache: &KvCache, device: Device) -> Result<Session> {
        let cfg = &self.config;
        let embed = match self.device_table(device) {
            Some(table) => Embed::Device(table),
            None => Embed::Host {
                x_host: Tensor::host_readable_in(&self.exec, [1, cfg.n_embd], DType::F32, device)?,
                x: Tensor::zeros_in(&self.exec, [1, cfg.n_embd], DType::F32, device)?,
            },
        };
        let inputs = Inputs {
            ids_host: Tensor::host_readable_in(&self.exec, [2], DType::I64, device)?,
            ids: Tensor::zeros_in(&self.exec, [2], DType::I64, device)?,
            embed,
        };
        let mut tables: Vec<(RopeParams, Tensor, Tensor)> = Vec::new();
        for il in 0..cfg.n_layer {
            let p = cfg.rope_for_layer(il);
            if tables.iter().any(|(q, _, _)| *q == p) {
                continue;
            }
            let (cos, sin) = rope::tables(&self.exec, &p, self.weights.rope_freqs.as_deref(), 0..cache.n_alloc())?;
            tables.push((p, cos.to_device(device)?, sin.to_device(device)?));
        }
        let logits = Tensor::host_readable_in(&self.exec, [1, cfg.n_vocab], DType::F32, device)?;
        Ok(Session {
            cache_id: cache.id(),
            device,
            inputs,
            tables,
            step_bytes: None,
            recorded: None,
            logits,
            times: StepTimes::wanted(),
        })
    }

    /// One step: inputs written, then the step run (first step), recorded
    /// and replayed (second), or replayed.
    fn step_in(&self, s: &mut Session, cache: &mut KvCache, token: u32) -> std::result::Result<Tensor, Fail> {
        let start = std::time::Instant::now();
        self.write_inputs(s, cache, token).map_err(Fail::Step)?;
        // The replay's start and end (for `times`), where the step replays.
        let mut replayed = None;
        match (&s.recorded, s.step_bytes) {
            (Some(recording), _) => {
                let inputs = std::time::Instant::now();
                self.exec
                    .replay(s.device, recording.as_ref())
                    .map_err(|e| Fail::Step(e.into()))?;
                let launch = std::time::Instant::now();
                // Timed steps wait here, so that the logits' copy is timed alone.
                if s.times.is_some() {
                    self.exec.synchronize().map_err(|e| Fail::Step(e.into()))?;
                }
                replayed = Some([inputs, launch, std::time::Instant::now()]);
            }
            (None, Some(bytes)) => {
                let arena = (bytes as usize).saturating_mul(ARENA_FACTOR).max(ARENA_MIN);
                let (inputs, tables, out) = (&mut s.inputs, &s.tables, &mut s.logits);
                let (recording, ()) = self
                    .exec
                    .capture(s.device, arena, || self.step_into(cache, inputs, tables, out))
                    .map_err(|e| Fail::Record(e.to_string()))?;
                self.exec
                    .replay(s.device, recording.as_ref())
                    .map_err(|e| Fail::Step(e.into()))?;
                s.recorded = Some(recording);
            }
            (None, None) => {
                let before = self.exec.bytes_allocated(s.device);
                // An op of the step that the device cannot run turns
                // recording off, and the step runs as `forward` runs it
                // (which rewrites whatever this wrote at the position; a
                // device that is really lost fails there too).
                self.step_into(cache, &mut s.inputs, &s.tables, &mut s.logits)
                    .map_err(|e| Fail::Record(e.to_string()))?;
                let after = self.exec.bytes_allocated(s.device);
                // A device that does not count its allocations records
                // nothing either: the next step finds out and turns
                // recording off.
                s.step_bytes = Some(match (before, after) {
                    (Some(b), Some(a)) => a.saturating_sub(b),
                    _ => 0,
                });
            }
        };
        let logits = self.finish_step(cache, &s.logits).map_err(Fail::Step)?;
        if let (Some(t), Some(at)) = (s.times.as_mut(), replayed) {
            t.add(start, at);
        }
        Ok(logits)
    }

    /// The token table on `device` for steps that look their token's row
    /// up there: the output's copy where the table is tied to it and that
    /// copy is kept as rows; else, for a table of its own (not tied), a
    /// copy uploaded by the first session (the file's bytes once on the
    /// GPU, as the weights are counted). `None` (the host looks rows up):
    /// the CPU, a tied table whose GPU copy is laid out for products only
    /// (a second copy would hold the table twice), or an upload that failed
    /// (a GPU without room for it), or `RUSTORCH_DEVICE_EMBEDDING=0` (the
    /// A/B switch).
    fn device_table(&self, device: Device) -> Option<QWeight> {
        if device.is_cpu() || matches!(std::env::var("RUSTORCH_DEVICE_EMBEDDING").as_deref(), Ok("0")) {
            return None;
        }
        self.recorded
            .table
            .get_or_init(|| {
                let (embd, out) = (&self.weights.tok_embd, &self.weights.output);
                if self.weights.output_tied && out.data().device() == device && !out.is_rearranged() {
                    return Some(out.clone());
                }
                if self.weights.output_tied || embd.is_rearranged() {
                    return None;
                }
                embd.to_device(device).ok()
            })
            .clone()
    }

    /// Checks the token and writes the step's inputs: the token and its
    /// position, and the token's row where the host looks it up.
    fn write_inputs(&self, s: &mut Session, cache: &KvCache, token: u32) -> Result<()> {
        self.check_tokens(cache, &[token])?;
        let ids = Tensor::from_vec(vec![token as i64, cache.len() as i64], [2])?.with_executor(&self.exec)?;
        if let Embed::Host { x_host, .. } = &mut s.inputs.embed {
            let row = self.weights.tok_embd.embedding(&ids.narrow(0, 0, 1)?)?;
            x_host.write_slice(0, 0, &row)?;
        }
        s.inputs.ids_host.write_slice(0, 0, &ids)?;
        Ok(())
    }

    /// The step's logits as the caller's own host tensor (the recording's
    /// buffer is rewritten by the next replay; sampling reads the host),
    /// and the cache one position longer.
    fn finish_step(&self, cache: &mut KvCache, logits: &Tensor) -> Result<Tensor> {
        // One copy into a host buffer of the caller's (`to_vec` made three:
        // the download, the host tensor's, the vector's; a tenth of a
        // 135M model's step went to host work). On the CPU `to_device` would
        // share the session's buffer, which the next step writes.
        let host = if logits.device().is_cpu() {
            Tensor::from_vec(logits.to_vec::<f32>()?, [1, self.config.n_vocab])?.with_executor(&self.exec)?
        } else {
            logits.to_device(Device::Cpu)?
        };
        cache.advance(1);
        Ok(host)
    }

    /// One decode step through the ops that a recorded step records, run
    /// one by one on the cache's device (no recording): the recorded path's
    /// arithmetic, checkable on any device (tests compare it with
    /// `forward` on the CPU). The cache must store values as rows
    /// (`Model::new_flash_cache`).
    #[doc(hidden)]
    pub fn decode_step_by_ops(&self, cache: &mut KvCache, token: u32) -> Result<Vec<f32>> {
        let device = cache.layer_device(0).unwrap_or(Device::Cpu);
        let mut s = self.new_session(cache, device)?;
        self.write_inputs(&mut s, cache, token)?;
        self.step_into(cache, &mut s.inputs, &s.tables, &mut s.logits)?;
        Ok(self.finish_step(cache, &s.logits)?.to_vec::<f32>()?)
    }

    /// The inputs copied to the device, then `step_body`, its logits
    /// written into `out` (the session's logits).
    fn step_into(
        &self,
        cache: &mut KvCache,
        inputs: &mut Inputs,
        tables: &[(RopeParams, Tensor, Tensor)],
        out: &mut Tensor,
    ) -> Result<()> {
        inputs.ids.write_slice(0, 0, &inputs.ids_host)?;
        let (token, pos) = (inputs.ids.narrow(0, 0, 1)?, inputs.ids.narrow(0, 1, 1)?);
        let x = match &mut inputs.embed {
            Embed::Device(table) => table.embedding(&token)?,
            Embed::Host { x_host, x } => {
                x.write_slice(0, 0, x_host)?;
                x.clone()
            }
        };
        let logits = self.step_body(cache, &x, &pos, tables)?;
        out.write_slice(0, 0, &logits)?;
        Ok(())
    }

    /// The step's ops from the hidden state `x_in` of the token at the
    /// position in `pos`: the same computation as `forward` for one token,
    /// with every per-token value read on the device.
    fn step_body(
        &self,
        cache: &mut KvCache,
        x_in: &Tensor,
        pos: &Tensor,
        tables: &[(RopeParams, Tensor, Tensor)],
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let mut x = if cfg.arch == Arch::Gemma3 {
            x_in.mul_scalar((cfg.n_embd as f32).sqrt() as f64)?
        } else {
            x_in.clone()
        };
        // This position's RoPE rows, one pair per settings, gathered when a
        // layer first needs them (an attention that rotates its inputs
        // itself reads the whole tables).
        let mut rows: Vec<(RopeParams, Tensor, Tensor)> = Vec::with_capacity(tables.len());
        // Each residual add, the norm after it and the products of the
        // normed row are one op (add_rms_norm_then: the GPU norms the row
        // inside the products' launch): `pending` is the last block's
        // output, not yet added to x.
        let eps = cfg.rms_eps as f64;
        let mut pending: Option<Tensor> = None;
        for il in 0..cfg.n_layer {
            let lw = &self.weights.layers[il];
            let settings = cfg.rope_for_layer(il);
            let layout = settings.layout;
            let (q, k, v) = match pending.take() {
                None => self.qkv_heads(il, x.rms_norm(Some(&lw.attn_norm), eps)?)?,
                Some(d) => {
                    let (s, qkv) = x.add_rms_norm_qmatmul_many(&d, &lw.attn_norm, eps, &[&lw.wq, &lw.wk, &lw.wv])?;
                    x = s;
                    self.heads_of_products(il, 1, qkv)?
                }
            };
            let attn = {
                let (q, k, v) = (q.transpose(0, 1)?, k.transpose(0, 1)?, v.transpose(0, 1)?);
                let window = cfg.window_for_layer(il);
                // Gemma scales the rotated queries before the attention (a
                // rounding the fused form does not make): the ops for it.
                let (_, cos_t, sin_t) = tables
                    .iter()
                    .find(|(p, _, _)| *p == settings)
                    .expect("tables were made for every layer's rope settings");
                let fused = if cfg.arch == Arch::Gemma3 {
                    None
                } else {
                    cache.rope_attention_at(il, (&q, &k, &v), (cos_t, sin_t, layout), pos, (cfg.attn_scale, window))?
                };
                let out = match fused {
                    Some(out) => out,
                    None => {
                        let at = match rows.iter().position(|(p, _, _)| *p == settings) {
                            Some(at) => at,
                            None => {
                                rows.push((settings, cos_t.index_select(0, pos)?, sin_t.index_select(0, pos)?));
                                rows.len() - 1
                            }
                        };
                        let (_, cos, sin) = &rows[at];
                        // q and k rotated, k and v into the cache: one launch on a GPU.
                        let mut q = cache.rope_write_at(il, &q, &k, &v, (cos, sin, layout), pos)?;
                        let scale = if cfg.arch == Arch::Gemma3 {
                            q = q.mul_scalar(cfg.attn_scale as f64)?;
                            1.0
                        } else {
                            cfg.attn_scale
                        };
                        let (kc, vc) = cache.layer(il);
                        Tensor::attention_at(&q, kc, vc, pos, scale, window)?
                    }
                };
                out.transpose(0, 1)?.reshape([1, cfg.n_head * cfg.head_dim_v])?
            };
            let mut a = attn.qmatmul(&lw.wo)?;
            if let Some(n) = &lw.post_attn_norm {
                a = a.rms_norm(Some(n), eps)?;
            }
            let (sum, act) =
                x.add_rms_norm_qmatmul_gated(&a, &lw.ffn_norm, eps, &lw.ffn_gate, &lw.ffn_up, self.gate_activation())?;
            x = sum;
            pending = Some(self.feed_forward_down(il, act, &mut |_, _, _| Ok(()))?);
        }
        let h = match pending {
            Some(d) => x.add_rms_norm(&d, &self.weights.output_norm, eps)?.1,
            None => x.rms_norm(Some(&self.weights.output_norm), eps)?,
        };
        self.logits_of_normed(&h, &mut |_, _, _| Ok(()))
    }
}

/// Why a recorded step did not give logits.
enum Fail {
    /// The step itself failed (bad input, a lost device): the caller's error.
    Step(LlmError),
    /// Recording is not possible here: steps go op by op from now on.
    Record(String),
}
