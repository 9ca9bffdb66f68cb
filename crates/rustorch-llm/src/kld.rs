//! llama-perplexity's log-probability files (`--kl-divergence-base`) and
//! its KL-divergence statistics (`--kl-divergence`), byte for byte and
//! figure for figure, so that a model run here can be compared with one
//! run by llama.cpp (on another device, or with another quantization) and
//! the other way round.
//!
//! The file: `_logits_`, then `n_ctx` (u32), `n_vocab` (i32), `n_chunk`
//! (i32), the `n_chunk * n_ctx` tokens of the text (i32, as tokenized,
//! before the BOS that each chunk starts with), then for each chunk and
//! each scored position (`n_ctx / 2 ..= n_ctx - 2`) one record of
//! `2 * ((n_vocab + 1) / 2) + 4` u16: the scale and the smallest log
//! probability as two f32, then each token's log probability quantized to
//! 16 bits over the 16 nats below the most likely token (lower ones as 0).
//! All little-endian (llama.cpp writes the host's order; x86 and ARM hosts
//! are little-endian).

use crate::error::{LlmError, Result};
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 per scored position in the file.
pub fn record_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// ggml's `nearest_int`: round to nearest, ties to even, for |v| < 2^22.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// The largest logit and `log(sum(exp(l - max)))` as llama-perplexity takes
/// them: `expf` per token, summed in f64, the log rounded to f32.
fn max_and_log_sum_exp(logits: &[f32]) -> (f32, usize, f32) {
    let mut max = logits[0];
    let mut imax = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            max = l;
            imax = i;
        }
    }
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (max, imax, sum.ln() as f32)
}

/// One position's record (`record_len` u16) for `logits`, as
/// llama-perplexity's `log_softmax` writes it.
pub fn encode(logits: &[f32], out: &mut [u16]) {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    let min = min.max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let log_sum_exp = sum.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0f32;
    let (head, rest) = out.split_at_mut(4);
    let s = scale.to_le_bytes();
    let m = min_log_prob.to_le_bytes();
    head[0] = u16::from_le_bytes([s[0], s[1]]);
    head[1] = u16::from_le_bytes([s[2], s[3]]);
    head[2] = u16::from_le_bytes([m[0], m[1]]);
    head[3] = u16::from_le_bytes([m[2], m[3]]);
    rest.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (q, &l) in rest.iter_mut().zip(logits) {
            if l > min {
                *q = nearest_int(inv * (l - min)) as u16;
            }
        }
    }
}

/// Writes a log-probability file as llama-perplexity's
/// `--kl-divergence-base` does while it computes perplexity.
pub struct BaseWriter<W: Write> {
    out: W,
    n_vocab: usize,
    record: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> BaseWriter<W> {
    /// Writes the header: `tokens` are the first `n_chunk * n_ctx` tokens
    /// of the text.
    pub fn new(mut out: W, n_ctx: usize, n_vocab: usize, n_chunk: usize, tokens: &[u32]) -> Result<Self> {
        let io = |e: std::io::Error| LlmError::InvalidArgument(format!("cannot write the log-probability file: {e}"));
        let small = |what: &str, v: usize| {
            i32::try_from(v).map_err(|_| LlmError::InvalidArgument(format!("{what} {v} does not fit the file format")))
        };
        let (c, v, k) = (
            small("n_ctx", n_ctx)?,
            small("n_vocab", n_vocab)?,
            small("n_chunk", n_chunk)?,
        );
        if tokens.len() < n_chunk * n_ctx {
            return Err(LlmError::InvalidArgument(format!(
                "{} tokens for {n_chunk} chunks of {n_ctx}",
                tokens.len()
            )));
        }
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(c as u32).to_le_bytes()).map_err(io)?;
        out.write_all(&v.to_le_bytes()).map_err(io)?;
        out.write_all(&k.to_le_bytes()).map_err(io)?;
        let mut header = Vec::with_capacity(n_chunk * n_ctx * 4);
        for &t in &tokens[..n_chunk * n_ctx] {
            header.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&header).map_err(io)?;
        Ok(BaseWriter {
            out,
            n_vocab,
            record: vec![0; record_len(n_vocab)],
            bytes: Vec::new(),
        })
    }

    /// Appends the records of one chunk's scored positions (`logits`: one
    /// row of `n_vocab` per position).
    pub fn chunk(&mut self, logits: &[f32]) -> Result<()> {
        self.bytes.clear();
        for row in logits.chunks_exact(self.n_vocab) {
            encode(row, &mut self.record);
            for q in &self.record {
                self.bytes.extend_from_slice(&q.to_le_bytes());
            }
        }
        self.out
            .write_all(&self.bytes)
            .map_err(|e| LlmError::InvalidArgument(format!("cannot write the log-probability file: {e}")))
    }

    pub fn finish(mut self) -> Result<W> {
        self.out
            .flush()
            .map_err(|e| LlmError::InvalidArgument(format!("cannot write the log-probability file: {e}")))?;
        Ok(self.out)
    }
}

/// A log-probability file opened for `--kl-divergence`: its header, then
/// one chunk's records at a time.
pub struct BaseReader<R: Read> {
    input: R,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// The text's tokens, `n_chunk * n_ctx`.
    pub tokens: Vec<u32>,
    chunk: Vec<u16>,
}

impl<R: Read> BaseReader<R> {
    pub fn new(mut input: R) -> Result<Self> {
        let bad =
            |what: &str| LlmError::InvalidArgument(format!("not a llama-perplexity log-probability file: {what}"));
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic).map_err(|_| bad("too short"))?;
        if &magic != MAGIC {
            return Err(bad("it does not start with _logits_"));
        }
        let mut word = [0u8; 4];
        let mut next = |what: &str| -> Result<u32> {
            input.read_exact(&mut word).map_err(|_| bad(what))?;
            Ok(u32::from_le_bytes(word))
        };
        let n_ctx = next("no n_ctx")? as usize;
        let n_vocab = next("no n_vocab")? as i32;
        let n_chunk = next("no n_chunk")? as i32;
        if n_ctx < 4 || n_vocab <= 0 || n_chunk <= 0 {
            return Err(bad(&format!("n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}")));
        }
        let (n_vocab, n_chunk) = (n_vocab as usize, n_chunk as usize);
        let count = n_chunk
            .checked_mul(n_ctx)
            .filter(|&c| c <= 1 << 31)
            .ok_or_else(|| bad("too many tokens"))?;
        let mut raw = vec![0u8; count * 4];
        input
            .read_exact(&mut raw)
            .map_err(|_| bad("fewer tokens than its header says"))?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        Ok(BaseReader {
            input,
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            chunk: Vec::new(),
        })
    }

    /// The next chunk's records (`scored` positions of `record_len` u16).
    pub fn next_chunk(&mut self, scored: usize) -> Result<&[u16]> {
        let n = scored * record_len(self.n_vocab);
        let mut raw = vec![0u8; n * 2];
        self.input
            .read_exact(&mut raw)
            .map_err(|_| LlmError::InvalidArgument("the log-probability file ends before its last chunk".into()))?;
        self.chunk.clear();
        self.chunk
            .extend(raw.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])));
        Ok(&self.chunk)
    }
}

/// llama-perplexity's running sums for `--kl-divergence`.
#[derive(Clone, Debug, Default)]
pub struct KlDivergence {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    count: usize,
    /// Each position's KL divergence and probability difference, for the
    /// percentiles.
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// `(mean, uncertainty)` as llama-perplexity's `mean_and_uncertainty`.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let c = count as f64;
    (ab / c - (a / c) * (b / c)) / (c - 1.0)
}

/// ggml's percentile: linear between the two nearest sorted values.
fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(sorted.len() - 1)]
}

/// C's printf spells a NaN `nan` (Rust: `NaN`), same width.
fn c_nan(s: String) -> String {
    s.replace("NaN", "nan")
}

fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

impl KlDivergence {
    /// Adds one position: this model's `logits`, the base's `record`, and
    /// the token that follows (`tok`).
    pub fn add(&mut self, logits: &[f32], record: &[u16], tok: usize) {
        let (max_logit, imax, log_sum_exp) = max_and_log_sum_exp(logits);
        let f = |a: u16, b: u16| {
            f32::from_le_bytes({
                let (x, y) = (a.to_le_bytes(), b.to_le_bytes());
                [x[0], x[1], y[0], y[1]]
            })
        };
        let scale = f(record[0], record[1]);
        let min_log_prob = f(record[2], record[3]);
        let base = &record[4..];
        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * base[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        let top = max_logit + log_sum_exp;
        let mut sum = 0f64;
        let mut imax_base = 0;
        let mut p_log_base_max = 0f32;
        for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * q as f32 + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += (p_base * (p_log_base - l + top)) as f64;
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_base = (-nll_base).exp();
        let p = (-nll).exp();
        let p_diff = p - p_base;
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Mean KL divergence and its uncertainty.
    pub fn mean_kld(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)
    }

    /// The share of positions whose most likely token is the base's.
    pub fn same_top(&self) -> f64 {
        self.n_same_top as f64 / self.count.max(1) as f64
    }

    /// This model's perplexity and the base's, over the positions so far.
    pub fn ppl(&self) -> (f64, f64) {
        let (a, _) = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let (b, _) = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        (a.exp(), b.exp())
    }

    /// llama-perplexity's line after each chunk: chunk, PPL, ln(PPL/base),
    /// KL divergence, RMS of the probability difference, same top token.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let ppl = log_ppl.0.exp();
        let log_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count);
        let ratio = log_ppl.0 - log_base.0;
        let ratio_unc = (log_ppl.1 * log_ppl.1 + log_base.1 * log_base.1 - 2.0 * cov).sqrt();
        let kl = self.mean_kld();
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        let rms_unc = 0.5 / rms * mse.1;
        let top = self.same_top();
        let top_unc = (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt();
        c_nan(format!(
            "{chunk:4}    {ppl:9.4} ± {:9.4}    {ratio:10.5} ± {ratio_unc:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            ppl * log_ppl.1,
            kl.0,
            kl.1,
            100.0 * rms,
            100.0 * rms_unc,
            100.0 * top,
            100.0 * top_unc
        ))
    }

    /// llama-perplexity's closing statistics (empty under 100 positions,
    /// as there).
    pub fn summary(&self) -> String {
        if self.count < 100 {
            return String::new();
        }
        let mut kld = self.kld_values.clone();
        let mut pd = self.p_diff_values.clone();
        kld.sort_by(f32::total_cmp);
        pd.sort_by(f32::total_cmp);
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let ppl = log_ppl.0.exp();
        let ppl_unc = ppl * log_ppl.1;
        let log_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let base = log_base.0.exp();
        let base_unc = base * log_base.1;
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count);
        let cor = cov / (log_ppl.1 * log_base.1);
        let ratio = log_ppl.0 - log_base.0;
        let ratio_unc = (log_ppl.1 * log_ppl.1 + log_base.1 * log_base.1 - 2.0 * cov).sqrt();
        let ppl_ratio = ratio.exp();
        let ppl_cov = ppl * base * cov;
        let diff_unc = (ppl_unc * ppl_unc + base_unc * base_unc - 2.0 * ppl_cov).sqrt();
        let kl = self.mean_kld();
        let p_diff = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count);
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        let top = self.same_top();
        let top_unc = (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt();
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line("====== Perplexity statistics ======".into());
        line(format!("Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"));
        line(format!("Mean PPL(base)                : {base:10.6} ± {base_unc:10.6}"));
        line(format!("Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%", 100.0 * cor));
        line(format!(
            "Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_unc:10.6}"
        ));
        line(format!(
            "Mean PPL(Q)/PPL(base)         : {ppl_ratio:10.6} ± {:10.6}",
            ppl_ratio * ratio_unc
        ));
        line(format!(
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
            ppl - base
        ));
        line(String::new());
        line("====== KL divergence statistics ======".into());
        line(format!("Mean    KLD: {:10.6} ± {:10.6}", kl.0, kl.1));
        line(format!("Maximum KLD: {:10.6}", kld[kld.len() - 1]));
        for (label, f) in [("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900)] {
            line(format!("{label}   KLD: {:10.6}", percentile(&kld, f)));
        }
        line(format!("Median  KLD: {:10.6}", median(&kld)));
        for (label, f) in [("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001)] {
            line(format!("{label}   KLD: {:10.6}", percentile(&kld, f)));
        }
        line(format!("Minimum KLD: {:10.6}", kld[0]));
        line(String::new());
        line("====== Token probability statistics ======".into());
        line(format!(
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * p_diff.0,
            100.0 * p_diff.1
        ));
        line(format!("Maximum Δp: {:6.3}%", 100.0 * pd[pd.len() - 1]));
        for (label, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.990),
            ("95.0%", 0.950),
            ("90.0%", 0.900),
            ("75.0%", 0.750),
        ] {
            line(format!("{label}   Δp: {:6.3}%", 100.0 * percentile(&pd, f)));
        }
        line(format!("Median  Δp: {:6.3}%", 100.0 * median(&pd)));
        for (label, f) in [
            ("25.0%", 0.250),
            ("10.0%", 0.100),
            (" 5.0%", 0.050),
            (" 1.0%", 0.010),
            (" 0.1%", 0.001),
        ] {
            line(format!("{label}   Δp: {:6.3}%", 100.0 * percentile(&pd, f)));
        }
        line(format!("Minimum Δp: {:6.3}%", 100.0 * pd[0]));
        line(format!(
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * 0.5 / rms * mse.1
        ));
        line(format!("Same top p: {:6.3} ± {:5.3} %", 100.0 * top, 100.0 * top_unc));
        c_nan(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65535.0), 65535);
        assert_eq!(nearest_int(0.49), 0);
    }

    #[test]
    fn a_file_reads_back_and_a_model_against_itself_has_no_divergence() {
        let n_vocab = 7;
        let n_ctx = 8;
        let tokens: Vec<u32> = (0..16).map(|i| i % 7).collect();
        let logits: Vec<f32> = (0..3 * n_vocab).map(|i| ((i * 37 % 11) as f32) * 0.7 - 3.0).collect();
        let mut w = BaseWriter::new(Vec::new(), n_ctx, n_vocab, 2, &tokens).unwrap();
        w.chunk(&logits).unwrap();
        w.chunk(&logits).unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len(), 8 + 12 + 16 * 4 + 2 * 3 * record_len(n_vocab) * 2);
        let mut r = BaseReader::new(&bytes[..]).unwrap();
        assert_eq!((r.n_ctx, r.n_vocab, r.n_chunk), (n_ctx, n_vocab, 2));
        assert_eq!(r.tokens, tokens);
        let mut kld = KlDivergence::default();
        for _ in 0..2 {
            let rec = r.next_chunk(3).unwrap().to_vec();
            for (p, row) in logits.chunks_exact(n_vocab).enumerate() {
                kld.add(row, &rec[p * record_len(n_vocab)..(p + 1) * record_len(n_vocab)], p);
            }
        }
        assert_eq!(kld.count(), 6);
        assert_eq!(kld.same_top(), 1.0);
        // Only the 16-bit quantization of the base separates them.
        assert!(kld.mean_kld().0.abs() < 1e-4, "{:?}", kld.mean_kld());
        assert!(r.next_chunk(3).is_err());
    }

    #[test]
    fn files_that_are_not_log_probabilities_are_errors() {
        assert!(BaseReader::new(&b"_logit"[..]).is_err());
        assert!(BaseReader::new(&b"_other__\x08\0\0\0"[..]).is_err());
        let mut v = b"_logits_".to_vec();
        v.extend(8u32.to_le_bytes());
        v.extend(7i32.to_le_bytes());
        v.extend(2i32.to_le_bytes());
        assert!(BaseReader::new(&v[..]).is_err(), "the tokens are missing");
    }
}
