//! The candidate array and llama.cpp's sampler steps on it (src/llama-sampler.cpp), each with
//! llama.cpp's definition: what it keeps, in which order it sums, when it sorts.
//!
//! The only freedom llama.cpp leaves open is the order of equal logits (its `std::partial_sort`
//! is unstable); here ties are ordered by id, lowest first, so results are reproducible.

use super::mt19937::Mt19937;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::collections::HashMap;

/// One candidate token (`llama_token_data`): id, logit, probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenData {
    pub id: u32,
    pub logit: f32,
    /// Set by [`Candidates::softmax`], [`Candidates::top_p`] (over the candidates before the
    /// cut) and [`Candidates::dist`]; 0 until then.
    pub p: f32,
}

/// The candidates a sampling step sees (`llama_token_data_array`): the surviving tokens,
/// whether they are sorted by logit (descending), and whether they are still all tokens in id
/// order (which lets penalties index them directly).
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    data: Vec<TokenData>,
    sorted: bool,
    id_order: bool,
}

/// Descending logit, then ascending id: the order of sorted candidates.
#[inline]
fn better(a: &TokenData, b: &TokenData) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A heap entry ordered so that the heap's top is the worst kept candidate.
struct Worst(TokenData);
impl PartialEq for Worst {
    fn eq(&self, o: &Self) -> bool {
        better(&self.0, &o.0) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        better(&self.0, &o.0)
    }
}

/// Occurrences of each token of a penalty window, sorted by id. The window is short
/// (repeat_last_n, 64 by default), so sorting beats hashing.
pub(crate) fn window_counts(last: &[u32]) -> Vec<(u32, u32)> {
    let mut ids = last.to_vec();
    ids.sort_unstable();
    let mut counts: Vec<(u32, u32)> = Vec::with_capacity(ids.len());
    for t in ids {
        match counts.last_mut() {
            Some(e) if e.0 == t => e.1 += 1,
            _ => counts.push((t, 1)),
        }
    }
    counts
}

/// llama.cpp's penalty of one logit seen `count` times.
#[inline]
pub(crate) fn penalized(logit: f32, count: u32, repeat: f32, freq: f32, present: f32) -> f32 {
    let l = if logit <= 0.0 { logit * repeat } else { logit / repeat };
    l - (count as f32 * freq + (count > 0) as u32 as f32 * present)
}

impl Candidates {
    /// All tokens, in id order, unsorted (as llama.cpp builds `cur_p` from a logits row).
    pub fn from_logits(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        c.fill(logits);
        c
    }

    /// Refills from a logits row, reusing the allocation.
    pub fn fill(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data.extend(logits.iter().enumerate().map(|(i, &logit)| TokenData {
            id: i as u32,
            logit,
            p: 0.0,
        }));
        self.sorted = false;
        self.id_order = true;
    }

    /// `fill(logits)`, then the logits of `overrides` (id, logit; sorted by id) replaced, then
    /// `top_k(k)`, in one pass that never materializes all candidates: what a sampler does per
    /// token on a large vocabulary. Equal to those three steps, ties included.
    pub fn fill_top_k(&mut self, logits: &[f32], k: usize, overrides: &[(u32, f32)]) {
        self.data.clear();
        let k = k.min(logits.len());
        self.sorted = true;
        self.id_order = false;
        if k == 0 {
            return;
        }
        let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
        let offer = |heap: &mut BinaryHeap<Worst>, c: TokenData| {
            if heap.len() < k {
                heap.push(Worst(c));
            } else if better(&c, &heap.peek().expect("heap holds k >= 1 entries").0) == Ordering::Less {
                heap.pop();
                heap.push(Worst(c));
            }
        };
        for &(id, logit) in overrides.iter().filter(|(id, _)| (*id as usize) < logits.len()) {
            offer(&mut heap, TokenData { id, logit, p: 0.0 });
        }
        let mut ov = overrides.iter().map(|o| o.0 as usize).peekable();
        const CHUNK: usize = 64;
        for (ci, chunk) in logits.chunks(CHUNK).enumerate() {
            let base = ci * CHUNK;
            let end = base + chunk.len();
            let has_override = ov.peek().is_some_and(|&id| id < end);
            if heap.len() == k && !has_override {
                // Skip chunks with nothing at or above the worst kept logit; counting (no early
                // exit) compiles to vector compares.
                let thr = heap.peek().expect("heap is full").0.logit;
                if chunk.iter().fold(0u32, |n, &x| n + (x >= thr) as u32) == 0 {
                    continue;
                }
            }
            for (j, &logit) in chunk.iter().enumerate() {
                let id = base + j;
                if ov.peek() == Some(&id) {
                    while ov.peek() == Some(&id) {
                        ov.next();
                    }
                    continue; // offered above with its replaced logit
                }
                offer(
                    &mut heap,
                    TokenData {
                        id: id as u32,
                        logit,
                        p: 0.0,
                    },
                );
            }
        }
        self.data.extend(heap.into_sorted_vec().into_iter().map(|w| w.0));
    }

    /// Candidates from explicit entries (not assumed sorted).
    pub fn from_data(data: Vec<TokenData>) -> Candidates {
        Candidates {
            data,
            sorted: false,
            id_order: false,
        }
    }

    pub fn as_slice(&self) -> &[TokenData] {
        &self.data
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Whether the candidates are in descending logit order.
    pub fn is_sorted(&self) -> bool {
        self.sorted
    }

    fn reordered(&mut self) {
        self.id_order = false;
    }

    /// Sorts the best `k` candidates to the front and drops the rest
    /// (`llama_token_data_array_partial_sort_inplace`).
    fn keep_top(&mut self, k: usize) {
        let n = self.data.len();
        let k = k.min(n);
        if k == 0 {
            self.data.clear();
        } else if k < n && k * 16 < n {
            // Few out of many (top-k 40 of a 262144 vocab): one pass with a heap of the k best
            // so far; most candidates are rejected by a single comparison with the heap's worst.
            let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
            for &c in &self.data {
                if heap.len() < k {
                    heap.push(Worst(c));
                } else if better(&c, &heap.peek().expect("heap holds k >= 1 entries").0) == Ordering::Less {
                    heap.pop();
                    heap.push(Worst(c));
                }
            }
            self.data.clear();
            // into_sorted_vec is ascending by Ord, i.e. best first.
            self.data.extend(heap.into_sorted_vec().into_iter().map(|w| w.0));
        } else {
            if k < n {
                self.data.select_nth_unstable_by(k - 1, better);
                self.data.truncate(k);
            }
            self.data.sort_unstable_by(better);
        }
        self.sorted = true;
        self.reordered();
    }

    /// Repetition, frequency and presence penalties (`llama_sampler_penalties`) for tokens seen
    /// in `last`: `count` occurrences of a token divide its logit by `repeat` (multiply if the
    /// logit is <= 0), then subtract `count * freq + present`.
    pub fn penalties(&mut self, last: &[u32], repeat: f32, freq: f32, present: f32) {
        if last.is_empty() || (repeat == 1.0 && freq == 0.0 && present == 0.0) {
            return;
        }
        let counts = window_counts(last);
        let penalize = |d: &mut TokenData, count: u32| d.logit = penalized(d.logit, count, repeat, freq, present);
        if self.id_order {
            for &(id, count) in &counts {
                if let Some(d) = self.data.get_mut(id as usize) {
                    penalize(d, count);
                }
            }
        } else {
            let map: HashMap<u32, u32> = counts.into_iter().collect();
            for d in &mut self.data {
                if let Some(&count) = map.get(&d.id) {
                    penalize(d, count);
                }
            }
        }
        self.sorted = false;
    }

    /// Keeps the `k` highest logits, sorted (`llama_sampler_top_k`); `k <= 0` keeps all.
    pub fn top_k(&mut self, k: i32) {
        if k <= 0 {
            return;
        }
        let k = (k as usize).min(self.data.len());
        if !self.sorted {
            self.keep_top(k);
        }
        self.data.truncate(k);
    }

    /// Softmax over the candidates in their current order (`llama_sampler_softmax_impl`,
    /// sorting first if `sort`): `p_i = exp(l_i - max) / sum`, the sum in f32 in array order.
    pub fn softmax(&mut self, sort: bool) {
        if self.data.is_empty() {
            return;
        }
        if sort && !self.sorted {
            let n = self.data.len();
            self.keep_top(n);
        }
        let max_l = if self.sorted {
            self.data[0].logit
        } else {
            self.data.iter().fold(self.data[0].logit, |m, d| m.max(d.logit))
        };
        let mut sum = 0.0f32;
        for d in &mut self.data {
            d.p = (d.logit - max_l).exp();
            sum += d.p;
        }
        for d in &mut self.data {
            d.p /= sum;
        }
    }

    /// Nucleus sampling (`llama_sampler_top_p`): softmax over the current candidates, then the
    /// smallest prefix of the sorted candidates whose cumulative probability (f32, summed in
    /// order) reaches `p`, and at least `min_keep` of them. `p >= 1` keeps all.
    pub fn top_p(&mut self, p: f32, min_keep: usize) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        self.softmax(false);
        let n = self.data.len();
        // llama.cpp sorts only the best 256 of a large unsorted set first and sorts the rest
        // when the sum needs more; the order, and so the sums, are those of a full sort.
        let mut k = n;
        if !self.sorted && n > 1024 {
            k = 256;
            self.data.select_nth_unstable_by(k - 1, better);
            self.data[..k].sort_unstable_by(better);
        } else if !self.sorted {
            self.data.sort_unstable_by(better);
        }
        self.reordered();
        let mut cum = 0.0f32;
        let mut last = n;
        let mut sorted_upto = k;
        for i in 0..n {
            if i == sorted_upto {
                // llama.cpp sorts everything left here; sorting the next best few (4x more each
                // time) gives the same order for the prefix the sum reads, without sorting a
                // 262144-entry tail that will be cut anyway.
                let next = (sorted_upto * 4).min(n);
                let tail = &mut self.data[sorted_upto..];
                let m = next - sorted_upto;
                if m < tail.len() {
                    tail.select_nth_unstable_by(m - 1, better);
                }
                tail[..m].sort_unstable_by(better);
                sorted_upto = next;
            }
            cum += self.data[i].p;
            if cum >= p && i + 1 >= min_keep {
                last = i + 1;
                break;
            }
        }
        // The kept prefix lies within the sorted part.
        self.data.truncate(last);
        self.sorted = true;
    }

    /// Min-p (`llama_sampler_min_p`): keeps candidates whose probability is at least `p` times
    /// the largest, i.e. logit >= max logit + ln(p); at least `min_keep`. `p <= 0` keeps all.
    pub fn min_p(&mut self, p: f32, min_keep: usize) {
        if p <= 0.0 || self.data.is_empty() {
            return;
        }
        let ln_p = p.ln();
        if !self.sorted {
            // llama.cpp filters unsorted candidates in place, keeping their order.
            let max_l = self.data.iter().fold(f32::NEG_INFINITY, |m, d| m.max(d.logit));
            let min_l = max_l + ln_p;
            let kept = self.data.iter().filter(|d| d.logit >= min_l).count();
            if kept > 0 && kept >= min_keep {
                if kept < self.data.len() {
                    self.data.retain(|d| d.logit >= min_l);
                    self.reordered();
                }
                return;
            }
            let n = self.data.len();
            self.keep_top(n);
        }
        let min_l = self.data[0].logit + ln_p;
        let mut i = 1;
        while i < self.data.len() {
            if self.data[i].logit < min_l && i >= min_keep {
                break;
            }
            i += 1;
        }
        self.data.truncate(i);
    }

    /// Temperature (`llama_sampler_temp`): logits divided by `t`; `t <= 0` keeps the first
    /// highest logit and sets the others to -inf.
    pub fn temperature(&mut self, t: f32) {
        if self.data.is_empty() {
            return;
        }
        if t <= 0.0 {
            let best = self.argmax();
            for (i, d) in self.data.iter_mut().enumerate() {
                if i != best {
                    d.logit = f32::NEG_INFINITY;
                }
            }
            return;
        }
        for d in &mut self.data {
            d.logit /= t;
        }
    }

    /// Index of the first highest logit (`llama_sampler_greedy`'s rule).
    pub fn argmax(&self) -> usize {
        let mut best = 0;
        for (i, d) in self.data.iter().enumerate().skip(1) {
            if d.logit > self.data[best].logit {
                best = i;
            }
        }
        best
    }

    /// The final draw (`llama_sampler_dist`): softmax (f32 terms, f64 sum), one uniform
    /// number `u`, and the first candidate where the running f64 sum reaches `u * sum`.
    /// Sets every `p` to its normalized probability and returns the index drawn, or `None`
    /// when there are no candidates. One uniform number is drawn even for a single candidate,
    /// as llama.cpp does.
    pub fn dist(&mut self, rng: &mut Mt19937) -> Option<usize> {
        if self.data.is_empty() {
            return None;
        }
        if self.data.len() == 1 {
            rng.uniform();
            self.data[0].p = 1.0;
            return Some(0);
        }
        let max_l = if self.sorted {
            self.data[0].logit
        } else {
            self.data.iter().fold(self.data[0].logit, |m, d| m.max(d.logit))
        };
        let mut sum = 0.0f64;
        for d in &mut self.data {
            d.p = (d.logit - max_l).exp();
            sum += d.p as f64;
        }
        let target = sum * rng.uniform();
        let mut run = 0.0f64;
        let mut selected = None;
        for (i, d) in self.data.iter_mut().enumerate() {
            if selected.is_none() {
                run += d.p as f64;
                if run >= target {
                    selected = Some(i);
                }
            }
            d.p = (d.p as f64 / sum) as f32;
        }
        // Unreachable for finite logits (the running sum ends at `sum` >= target); llama.cpp
        // falls back to the last candidate too.
        Some(selected.unwrap_or(self.data.len() - 1))
    }
}
