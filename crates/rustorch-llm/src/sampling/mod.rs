//! Sampling (placeholder while chat builds).
pub struct Sampler;
pub struct SamplerConfig;
pub struct StopMatcher;
